//! Token embedding: a row gather, and its backward, a row scatter-add.

use crate::Real;

fn vocab_of(len: usize, dim: usize) -> usize {
    assert!(dim > 0, "embedding: dim is 0");
    assert_eq!(
        len % dim,
        0,
        "embedding: table holds {len} values, not a multiple of dim {dim}"
    );
    len / dim
}

/// Forward: `table [vocab, dim]`, `tokens [n]` -> `out [n, dim]`.
///
/// Panics if a token is `>= vocab`.
pub fn embedding_forward<T: Real>(table: &[T], dim: usize, tokens: &[u32]) -> Vec<T> {
    let vocab = vocab_of(table.len(), dim);
    let mut out = Vec::with_capacity(tokens.len() * dim);
    for (i, &tok) in tokens.iter().enumerate() {
        let t = tok as usize;
        assert!(
            t < vocab,
            "embedding: token {tok} at position {i} is outside the vocabulary of {vocab}"
        );
        out.extend_from_slice(&table[t * dim..(t + 1) * dim]);
    }
    out
}

/// Backward: accumulates (`+=`) the rows of `dy [n, dim]` into `dtable [vocab, dim]`
/// at `tokens [n]`, in token order (deterministic).
///
/// Panics if a token is `>= vocab`.
pub fn embedding_backward<T: Real>(dtable: &mut [T], dim: usize, tokens: &[u32], dy: &[T]) {
    let vocab = vocab_of(dtable.len(), dim);
    assert_eq!(
        dy.len(),
        tokens.len() * dim,
        "embedding backward: dy holds {} values for [{}, {dim}]",
        dy.len(),
        tokens.len()
    );
    for (i, (&tok, g)) in tokens.iter().zip(dy.chunks_exact(dim)).enumerate() {
        let t = tok as usize;
        assert!(
            t < vocab,
            "embedding backward: token {tok} at position {i} is outside the vocabulary of {vocab}"
        );
        for (d, &gv) in dtable[t * dim..(t + 1) * dim].iter_mut().zip(g) {
            *d += gv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check_grad, rand_vec};

    #[test]
    fn forward_gathers_rows() {
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [4, 3]
        let y = embedding_forward(&table, 3, &[2, 0, 2]);
        assert_eq!(y, vec![6., 7., 8., 0., 1., 2., 6., 7., 8.]);
    }

    #[test]
    fn backward_matches_finite_differences() {
        let (vocab, dim) = (5, 3);
        let tokens = [3u32, 0, 3, 4, 3, 1, 0];
        let table = rand_vec(vocab * dim, 1, 1.0);
        let dy = rand_vec(tokens.len() * dim, 2, 1.0);
        let mut dtable = vec![0.0; vocab * dim];
        embedding_backward(&mut dtable, dim, &tokens, &dy);
        check_grad("embedding dtable", &table, &dtable, |t| {
            let y = embedding_forward(t, dim, &tokens);
            y.iter().zip(&dy).map(|(a, b)| a * b).sum()
        });
        // It accumulates.
        let mut twice = dtable.clone();
        embedding_backward(&mut twice, dim, &tokens, &dy);
        for (a, b) in twice.iter().zip(&dtable) {
            assert_eq!(*a, 2.0 * b);
        }
    }

    #[test]
    #[should_panic(expected = "token 4 at position 1 is outside the vocabulary of 4")]
    fn out_of_vocabulary_token_panics() {
        let table = vec![0f32; 8]; // [4, 2]
        embedding_forward(&table, 2, &[1, 4]);
    }
}
