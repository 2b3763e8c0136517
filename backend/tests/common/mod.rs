//! Helpers shared by the HF-parity tests (CPU and GPU): the fixture folders
//! and the logits HF computed for them (tests/fixtures/make_fixtures.py).

use std::path::PathBuf;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// (tokens, HF logits) for each sequence of a fixture.
pub fn expected(name: &str) -> Vec<(Vec<u32>, Vec<f32>)> {
    let bytes = std::fs::read(fixture(name).join("expected.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    (0..)
        .map_while(|i| {
            let t = st.tensor(&format!("tokens_{i}")).ok()?;
            let l = st.tensor(&format!("logits_{i}")).ok()?;
            let toks = t
                .data()
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
                .collect();
            Some((toks, f32s(l.data())))
        })
        .collect()
}
