//! Every kernel the Rust side launches by a literal name is defined in the module it
//! names, checked without a GPU or NVRTC: each module's source (`common.cuh` plus
//! the files `context.rs` assembles for it) goes through the C preprocessor, so
//! kernels a macro pastes together count, and every `launch(&MODULE, "name", ..)` /
//! `launch_clustered(&MODULE, "name", ..)` in `src/cuda` must find `name` among
//! that module's `__global__` functions. A name chosen at run time (a `match`, a
//! `format!`) is not seen here; NVRTC finds those on the GPU.
//!
//! Why: a branch that undid a kernel's file by checking out an older copy left the
//! Rust side launching a kernel that no longer existed, which only a GPU run
//! would have shown.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn cuda_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda")
}

/// The identifier starting at `s` (letters, digits, `_`) and the rest.
fn ident(s: &str) -> (&str, &str) {
    let n = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    s.split_at(n)
}

/// `const NAME: Source = Source { name: .., code: .. include_str!("kernels/f") .. };`
/// in context.rs: each module's constant and its files, in order.
fn modules(ctx: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut rest = ctx;
    while let Some(i) = rest.find("const ") {
        rest = &rest[i + 6..];
        let (name, after) = ident(rest);
        let Some(body) = after.trim_start().strip_prefix(": Source = Source {") else {
            continue;
        };
        let end = body
            .find("};")
            .expect("context.rs: a Source without its end");
        let files = body[..end]
            .split("include_str!(\"")
            .skip(1)
            .map(|f| f[..f.find('"').unwrap()].to_string())
            .collect();
        out.insert(name.to_string(), files);
        rest = &body[end..];
    }
    out
}

/// The `__global__` functions of preprocessed CUDA source.
fn kernels(pre: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in pre.split("__global__").skip(1) {
        let Some(mut s) = part.trim_start().strip_prefix("void") else {
            continue;
        };
        s = s.trim_start();
        if let Some(b) = s.strip_prefix("__launch_bounds__") {
            s = b[b.find(')').expect("__launch_bounds__ without ')'") + 1..].trim_start();
        }
        let (name, _) = ident(s);
        if !name.is_empty() {
            out.insert(name.to_string());
        }
    }
    out
}

/// Run `cpp` over `code` as NVRTC would see it for sm_90a; None where there is no cpp.
fn preprocess(code: &str) -> Option<String> {
    let child = Command::new("cpp")
        .args(["-P", "-w", "-x", "c++", "-D__CUDA_ARCH__=900"])
        .args(["-D__CUDA_ARCH_FEAT_SM90_ALL", "-D__CUDACC_RTC__", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            println!("skipping: no C preprocessor (cpp: {e})");
            return None;
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    let code = code.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(code.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "cpp failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// `(file, module constant, kernel name)` of every launch by a literal name.
fn literal_launches(dir: &Path, out: &mut Vec<(String, String, String)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            literal_launches(&p, out);
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for call in [".launch(", ".launch_clustered("] {
            for part in text.split(call).skip(1) {
                let Some(s) = part.trim_start().strip_prefix('&') else {
                    continue;
                };
                let (module, s) = ident(s);
                let Some(s) = s.trim_start().strip_prefix(',') else {
                    continue;
                };
                let Some(s) = s.trim_start().strip_prefix('"') else {
                    continue;
                };
                let name = &s[..s.find('"').unwrap()];
                let file = p.strip_prefix(dir.parent().unwrap()).unwrap();
                out.push((file.display().to_string(), module.into(), name.into()));
            }
        }
    }
}

#[test]
fn every_literal_launch_names_a_kernel_of_its_module() {
    let dir = cuda_dir();
    let ctx = std::fs::read_to_string(dir.join("context.rs")).unwrap();
    let common = std::fs::read_to_string(dir.join("kernels/common.cuh")).unwrap();
    let mut defined = BTreeMap::new();
    for (module, files) in modules(&ctx) {
        let mut code = format!("{common}\n");
        for f in &files {
            code += &std::fs::read_to_string(dir.join(f)).unwrap();
        }
        let Some(pre) = preprocess(&code) else { return };
        defined.insert(module, kernels(&pre));
    }
    assert!(
        defined.len() >= 10 && defined.values().map(BTreeSet::len).sum::<usize>() >= 100,
        "context.rs parsed into too few modules or kernels: {defined:?}"
    );
    let mut launches = Vec::new();
    literal_launches(&dir, &mut launches);
    assert!(
        launches.len() >= 40,
        "only {} literal launches found",
        launches.len()
    );
    let missing: Vec<_> = launches
        .iter()
        .filter(|(_, m, n)| defined.get(m).is_none_or(|k| !k.contains(n)))
        .collect();
    assert!(
        missing.is_empty(),
        "launched but not defined in the module named (file, module, kernel): {missing:?}"
    );
    println!(
        "{} literal launches, each a kernel of its module ({} modules)",
        launches.len(),
        defined.len()
    );
}
