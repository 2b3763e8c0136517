//! Saving and loading: bitwise round trips, half-precision and sharded files.

use safetensors::Dtype;
use serde_json::json;

use super::super::{init_random, load_model, save_model, tensor_specs, Arch, ModelWeights};
use super::{raw_tensors, tempdir, tiny, write_config, write_safetensors, ALL_ARCHS};

fn bits(w: &ModelWeights) -> Vec<(String, Vec<u32>)> {
    w.tensors()
        .into_iter()
        .map(|(n, t)| (n, t.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

#[test]
fn tensors_follow_spec_order() {
    for arch in ALL_ARCHS {
        for tied in [false, true] {
            let cfg = tiny(arch, tied);
            let specs = tensor_specs(&cfg);
            let mut w = ModelWeights::zeros(&cfg);
            let names: Vec<String> = w.tensors().into_iter().map(|(n, _)| n).collect();
            let spec_names: Vec<String> = specs.iter().map(|(n, _)| n.clone()).collect();
            assert_eq!(names, spec_names);
            for ((_, t), (_, shape)) in w.tensors().into_iter().zip(&specs) {
                assert_eq!(t.len(), shape.iter().product::<usize>());
            }
            let mut_names: Vec<String> = w.tensors_mut().into_iter().map(|(n, _)| n).collect();
            assert_eq!(mut_names, spec_names);
            assert_eq!(w.num_params(), cfg.param_count());
            assert_eq!(specs.last().unwrap().0 == "lm_head.weight", !tied);
            w.check(&cfg).unwrap();
        }
    }
    let cfg = tiny(Arch::Qwen3, false);
    let names: Vec<String> = tensor_specs(&cfg).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[0], "model.embed_tokens.weight");
    assert_eq!(names[1], "model.layers.0.input_layernorm.weight");
    assert!(names.contains(&"model.layers.1.self_attn.k_norm.weight".to_string()));
    assert_eq!(names[names.len() - 2], "model.norm.weight");
}

#[test]
fn save_load_round_trip_is_bitwise() {
    for arch in ALL_ARCHS {
        for tied in [false, true] {
            let cfg = tiny(arch, tied);
            let mut w = init_random(&cfg, 7);
            // Make norms and biases non-trivial too, with odd bit patterns.
            for (i, (_, t)) in w.tensors_mut().into_iter().enumerate() {
                t[0] = f32::from_bits(0x3f80_0001 + i as u32);
            }
            let dir = tempdir();
            save_model(dir.path(), &cfg, &w).unwrap();
            let (cfg2, w2) = load_model(dir.path()).unwrap();
            assert_eq!(cfg2, cfg, "{arch:?} tied={tied}");
            assert_eq!(bits(&w2), bits(&w), "{arch:?} tied={tied}");
            // Tied models do not store lm_head, like HF.
            let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            assert_eq!(st.names().contains(&"lm_head.weight"), !tied);
            assert!(st.iter().all(|(_, v)| v.dtype() == Dtype::F32));
            // Only the two files, no temporaries left behind.
            let mut files: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            assert_eq!(files, ["config.json", "model.safetensors"]);
        }
    }
}

#[test]
fn save_overwrites_and_creates_dir() {
    let cfg = tiny(Arch::Qwen2, true);
    let dir = tempdir();
    let sub = dir.path().join("a/b");
    save_model(&sub, &cfg, &init_random(&cfg, 1)).unwrap();
    let w2 = init_random(&cfg, 2);
    save_model(&sub, &cfg, &w2).unwrap();
    assert_eq!(load_model(&sub).unwrap().1, w2);
}

#[test]
fn save_rejects_weights_that_do_not_fit() {
    let cfg = tiny(Arch::Llama, false);
    let mut w = init_random(&cfg, 1);
    w.layers[1].q_proj.pop();
    let dir = tempdir();
    let err = save_model(dir.path(), &cfg, &w).unwrap_err().to_string();
    assert!(
        err.contains("model.layers.1.self_attn.q_proj.weight"),
        "{err}"
    );
    let mut w = init_random(&cfg, 1);
    w.lm_head = None;
    let err = save_model(dir.path(), &cfg, &w).unwrap_err().to_string();
    assert!(err.contains("lm_head.weight"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

fn half_round_trip(dtype: Dtype, round: fn(f32) -> f32) {
    for arch in ALL_ARCHS {
        let cfg = tiny(arch, false);
        let w = init_random(&cfg, 3);
        let dir = tempdir();
        write_config(dir.path(), &cfg);
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &raw_tensors(&cfg, &w, dtype),
        );
        let (_, got) = load_model(dir.path()).unwrap();
        let mut want = w.clone();
        for (_, t) in want.tensors_mut() {
            t.iter_mut().for_each(|x| *x = round(*x));
        }
        assert_eq!(bits(&got), bits(&want), "{arch:?} {dtype}");
        assert_ne!(bits(&got), bits(&w), "rounding should change something");
    }
}

#[test]
fn loads_bf16() {
    half_round_trip(Dtype::BF16, |x| half::bf16::from_f32(x).to_f32());
}

#[test]
fn loads_f16() {
    half_round_trip(Dtype::F16, |x| half::f16::from_f32(x).to_f32());
}

#[test]
fn loads_two_shards() {
    for tied in [false, true] {
        let cfg = tiny(Arch::Qwen3, tied);
        let w = init_random(&cfg, 11);
        let dir = tempdir();
        write_config(dir.path(), &cfg);
        let raw = raw_tensors(&cfg, &w, Dtype::BF16);
        let (a, b) = raw.split_at(raw.len() / 2);
        let names = [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ];
        let mut weight_map = serde_json::Map::new();
        for (part, shard) in [a, b].into_iter().zip(names) {
            write_safetensors(&dir.path().join(shard), part);
            for (n, ..) in part {
                weight_map.insert(n.clone(), json!(shard));
            }
        }
        let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let (cfg2, got) = load_model(dir.path()).unwrap();
        assert_eq!(cfg2, cfg);
        let mut want = w.clone();
        for (_, t) in want.tensors_mut() {
            t.iter_mut()
                .for_each(|x| *x = half::bf16::from_f32(*x).to_f32());
        }
        assert_eq!(bits(&got), bits(&want));
    }
}

#[test]
fn tied_lm_head_and_rotary_buffers_are_ignored() {
    let cfg = tiny(Arch::Llama, true);
    let w = init_random(&cfg, 5);
    let dir = tempdir();
    write_config(dir.path(), &cfg);
    let mut raw = raw_tensors(&cfg, &w, Dtype::F32);
    let lm = super::encode(Dtype::F32, &vec![9.0; 32 * 16]);
    raw.push(("lm_head.weight".into(), Dtype::F32, vec![32, 16], lm));
    raw.push((
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        Dtype::F32,
        vec![2],
        super::encode(Dtype::F32, &[1.0, 0.5]),
    ));
    write_safetensors(&dir.path().join("model.safetensors"), &raw);
    let (_, got) = load_model(dir.path()).unwrap();
    assert_eq!(got, w);
    assert_eq!(got.lm_head_weights(), got.embed_tokens.as_slice());
}
