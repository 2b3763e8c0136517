//! Tensor maps for the bulk tensor copies of Hopper's tensor memory accelerator
//! (`cp.async.bulk.tensor` in `gemm_wg.cu`): a 2-D tile of a row-major matrix,
//! rows and columns past the matrix's end filled with zeros.

use cudarc::driver::sys;

use super::{ensure, Ctx, Result};

/// A `CUtensorMap`: 128 opaque bytes a kernel takes by value (`TMap` in
/// `gemm_wg.cu`).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct TensorMap([u64; 16]);

/// An element type of a tensor map.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TmaElem {
    U8,
    Bf16,
    F32,
}

impl TmaElem {
    fn bytes(self) -> u64 {
        match self {
            TmaElem::U8 => 1,
            TmaElem::Bf16 => 2,
            TmaElem::F32 => 4,
        }
    }
}

/// The map of `[rows][cols]` elements at device address `ptr`, rows `ld` elements
/// apart, copied in boxes of `box_cols x box_rows`; `swizzle` (bytes: 0, 32 or
/// 128): the box lies in shared memory in that swizzle, its rows then `swizzle`
/// bytes long: 16-byte unit u of box row r at u ^ ((r * swizzle / 128) % (swizzle /
/// 16)), i.e. u ^ (r % 8) for 128 and u ^ (r / 4 % 2) for 32 (the unit's address
/// bits XORed with bits 7 and up, so the tile is aligned to 8 x `swizzle` bytes).
pub(crate) fn tensor_map_2d(
    elem: TmaElem,
    ptr: u64,
    (rows, cols, ld): (usize, usize, usize),
    (box_cols, box_rows): (u32, u32),
    swizzle: u32,
) -> Result<TensorMap> {
    let eb = elem.bytes();
    let stride = ld as u64 * eb;
    ensure(
        ptr.is_multiple_of(16) && stride.is_multiple_of(16) && rows > 0 && cols > 0,
        || {
            format!("tensor map over [{rows}][{cols}] at {ptr:#x}, row stride {stride} bytes: needs 16-byte alignment")
        },
    )?;
    ensure(matches!(swizzle, 0 | 32 | 128), || {
        format!("tensor map swizzle of {swizzle} bytes: 0, 32 or 128 are supported")
    })?;
    ensure(
        swizzle == 0 || box_cols as u64 * eb == swizzle as u64,
        || {
            format!("a {swizzle}-byte swizzled box has {swizzle}-byte rows, not {box_cols} x {eb} bytes")
        },
    )?;
    let ty = match elem {
        TmaElem::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        TmaElem::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        TmaElem::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    };
    let dims = [cols as u64, rows as u64];
    let strides = [stride];
    let boxes = [box_cols, box_rows];
    let unit = [1u32, 1];
    let swizzle = match swizzle {
        128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
    };
    // SAFETY: a zeroed map is valid to write into.
    let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
    // SAFETY: every pointer is to a live local of the length rank 2 asks for;
    // encoding reads no device memory.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            ty,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            unit.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .ctx(&format!(
        "encoding a tensor map over [{rows}][{cols}] (box {box_cols} x {box_rows})"
    ))?;
    Ok(TensorMap(map.opaque))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Rejected before any driver call, so these run without a GPU.
    #[test]
    fn misaligned_maps_are_refused_with_the_shape() {
        let e = tensor_map_2d(TmaElem::U8, 0x1008, (4, 256, 256), (128, 128), 128).unwrap_err();
        assert!(e.to_string().contains("[4][256]"), "{e}");
        let e = tensor_map_2d(TmaElem::F32, 0x1000, (4, 6, 6), (128, 1), 0).unwrap_err();
        assert!(e.to_string().contains("24 bytes"), "{e}");
        let e = tensor_map_2d(TmaElem::Bf16, 0x1000, (4, 256, 256), (128, 128), 128).unwrap_err();
        assert!(e.to_string().contains("128-byte rows"), "{e}");
        let e = tensor_map_2d(TmaElem::Bf16, 0x1000, (4, 256, 256), (32, 64), 32).unwrap_err();
        assert!(e.to_string().contains("32-byte rows"), "{e}");
        let e = tensor_map_2d(TmaElem::Bf16, 0x1000, (4, 256, 256), (32, 64), 64).unwrap_err();
        assert!(e.to_string().contains("0, 32 or 128"), "{e}");
        let e = tensor_map_2d(TmaElem::U8, 0x1000, (0, 256, 256), (128, 128), 128).unwrap_err();
        assert!(e.to_string().contains("[0][256]"), "{e}");
    }
}
