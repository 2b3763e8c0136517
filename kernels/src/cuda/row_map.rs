//! Row maps between two layouts of a packed batch (`gather_words`,
//! `gather_sum_rows` in `tensor.cu`), checked and uploaded once and then read by
//! every layer: a GRPO group's shared prompt rows copied out to each sequence for
//! the attention, and its outputs and gradients brought back.
//!
//! [`RowMap::gather`] is a copy (the bits of the source rows, or zeros);
//! [`RowSums::sum`] adds each output row's sources in the order given, one f32
//! addition at a time (deterministic, no atomics).

use cudarc::driver::{CudaSlice, DeviceRepr};

use super::context::{Arg, TENSOR};
use super::tensor::BLOCK;
use super::{check_len, ensure, CudaError, Gpu, Result};

/// One thread a value: `n` values in blocks of 256, refused past a grid's limit.
fn grid(what: &str, n: usize) -> Result<(u32, u32, u32)> {
    let blocks = n.div_ceil(BLOCK as usize);
    ensure(blocks <= i32::MAX as usize, || {
        format!("{what}: {n} values are too many for one launch")
    })?;
    Ok(super::tensor::grid(n))
}

/// Output row j reads input row `rows[j]`, or is zero where `rows[j]` is None; the
/// input has `have` rows.
pub struct RowMap {
    idx: CudaSlice<i64>,
    n: usize,
    have: usize,
}

impl RowMap {
    pub fn new(gpu: &Gpu, rows: &[Option<usize>], have: usize) -> Result<RowMap> {
        if let Some((j, r)) = rows
            .iter()
            .enumerate()
            .find_map(|(j, r)| r.filter(|&r| r >= have).map(|r| (j, r)))
        {
            return Err(CudaError::Invalid(format!(
                "row map: entry {j} reads row {r} of {have}"
            )));
        }
        let idx: Vec<i64> = rows.iter().map(|r| r.map_or(-1, |r| r as i64)).collect();
        Ok(RowMap {
            idx: gpu.upload(&idx)?,
            n: rows.len(),
            have,
        })
    }

    /// Rows of the output.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// `out [len, cols]`: row j a copy of `x`'s row `rows[j]` (`x [have, cols]`
    /// dense, row stride `cols`; f32 or BF16 values), or zeros. A row must be a whole
    /// number of 4-byte words.
    pub fn gather<T: DeviceRepr>(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<T>,
        cols: usize,
    ) -> Result<CudaSlice<T>> {
        let bytes = cols * std::mem::size_of::<T>();
        ensure(bytes > 0 && bytes.is_multiple_of(4), || {
            format!("row map: rows of {bytes} bytes (needs a positive multiple of 4)")
        })?;
        let have = self.have;
        check_len("row map input", x, have * cols, format!("[{have}, {cols}]"))?;
        let out = gpu.uninit::<T>(self.n * cols)?;
        let words = bytes / 4;
        if self.n > 0 {
            gpu.launch(
                &TENSOR,
                "gather_words",
                grid("row map", self.n * words)?,
                (BLOCK, 1, 1),
                0,
                &[
                    Arg::P(gpu.ptr(x)),
                    Arg::P(gpu.ptr(&self.idx)),
                    Arg::L(self.n as i64),
                    Arg::L(words as i64),
                    Arg::P(gpu.ptr(&out)),
                ],
            )?;
        }
        Ok(out)
    }
}

/// Output row j is the sum of input rows `groups[j]`, in that order; the input has
/// `have` rows.
pub struct RowSums {
    off: CudaSlice<i64>,
    idx: CudaSlice<i64>,
    n: usize,
    have: usize,
}

impl RowSums {
    pub fn new(gpu: &Gpu, groups: &[Vec<usize>], have: usize) -> Result<RowSums> {
        let mut off = Vec::with_capacity(groups.len() + 1);
        let mut idx = Vec::new();
        off.push(0i64);
        for (j, g) in groups.iter().enumerate() {
            ensure(!g.is_empty(), || {
                format!("row sums: output row {j} has no rows")
            })?;
            if let Some(&r) = g.iter().find(|&&r| r >= have) {
                return Err(CudaError::Invalid(format!(
                    "row sums: output row {j} reads row {r} of {have}"
                )));
            }
            idx.extend(g.iter().map(|&r| r as i64));
            off.push(idx.len() as i64);
        }
        Ok(RowSums {
            off: gpu.upload(&off)?,
            idx: gpu.upload(&idx)?,
            n: groups.len(),
            have,
        })
    }

    /// `out [len, cols]`: row j the f32 sum of `x`'s rows `groups[j]` in order
    /// (`x [have, cols]`), rounded to BF16 values when `round`.
    pub fn sum(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<f32>,
        cols: usize,
        round: bool,
    ) -> Result<CudaSlice<f32>> {
        let have = self.have;
        check_len(
            "row sums input",
            x,
            have * cols,
            format!("[{have}, {cols}]"),
        )?;
        let out = gpu.uninit::<f32>(self.n * cols)?;
        if self.n > 0 && cols > 0 {
            gpu.launch(
                &TENSOR,
                "gather_sum_rows",
                grid("row sums", self.n * cols)?,
                (BLOCK, 1, 1),
                0,
                &[
                    Arg::P(gpu.ptr(x)),
                    Arg::P(gpu.ptr(&self.off)),
                    Arg::P(gpu.ptr(&self.idx)),
                    Arg::L(self.n as i64),
                    Arg::L(cols as i64),
                    Arg::I(round as i32),
                    Arg::P(gpu.ptr(&out)),
                ],
            )?;
        }
        Ok(out)
    }
}
