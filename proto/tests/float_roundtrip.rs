//! Metrics travel as JSON (the store, the socket, `--metrics-out`) and the
//! bit-for-bit resume checks compare them: a float must come back with the same
//! bits. serde_json's default parser can be one ulp off; the workspace enables
//! its `float_roundtrip` feature. Seen on an H200 before the fix: a resumed run's
//! `mismatch_kl` read 1.9637842254299434e-10 where the uninterrupted run wrote
//! 1.9637842254299432e-10, the same value parsed differently.

fn roundtrip(x: f64) -> f64 {
    let v = serde_json::json!({ "m": x });
    let text = serde_json::to_string(&v).unwrap();
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    back["m"].as_f64().unwrap()
}

#[test]
fn floats_survive_a_json_round_trip_bit_for_bit() {
    let mut bad = Vec::new();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut xs = vec![
        1.9637842254299432e-10,
        1.9637842254299434e-10,
        0.1,
        1e-300,
        5e-324,
    ];
    for _ in 0..200_000 {
        // xorshift64*: spread over every exponent and mantissa
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        let x = f64::from_bits(s.wrapping_mul(0x2545_f491_4f6c_dd1d));
        if x.is_finite() {
            xs.push(x);
        }
    }
    for x in xs {
        let y = roundtrip(x);
        if y.to_bits() != x.to_bits() {
            bad.push(format!("{x:e} -> {y:e}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} values changed: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}
