//! Models Ollama has already pulled, run in place: `ollama:NAME[:TAG]` resolves through
//! Ollama's manifest to its model blob (a GGUF file), which is read where it lies.
//!
//! The store is `$OLLAMA_MODELS`, else `~/.ollama/models`, else the Linux service's
//! `/usr/share/ollama/.ollama/models`. A name is `model`, `namespace/model` or
//! `host/namespace/model`, defaulting to `registry.ollama.ai` and `library`, and the tag to
//! `latest`, as `ollama run` reads them. The manifest's `application/vnd.ollama.image.model`
//! layer is the weights; its chat template is the GGUF's own (Ollama's template layer is a
//! Go template kiln does not run).

use std::path::{Path, PathBuf};

use crate::AssetError;

const MODEL_LAYER: &str = "application/vnd.ollama.image.model";

/// The stores to look in, in order.
fn stores() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("OLLAMA_MODELS").filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(d)];
    }
    let mut v = Vec::new();
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        v.push(Path::new(&h).join(".ollama/models"));
    }
    v.push(PathBuf::from("/usr/share/ollama/.ollama/models"));
    v
}

/// `name[:tag]` as the manifest's path under `manifests/`.
fn manifest_path(name: &str) -> Result<PathBuf, String> {
    let (repo, tag) = match name.rsplit_once(':') {
        // A colon inside a host (host:port/ns/model) is not a tag.
        Some((r, t)) if !t.contains('/') => (r, t),
        _ => (name, "latest"),
    };
    let parts: Vec<&str> = repo.split('/').collect();
    let (host, ns, model) = match parts.as_slice() {
        [m] => ("registry.ollama.ai", "library", *m),
        [n, m] => ("registry.ollama.ai", *n, *m),
        [h, n, m] => (*h, *n, *m),
        _ => {
            return Err(format!(
                "'{name}' is not an Ollama model name (model[:tag])"
            ))
        }
    };
    let ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-:".contains(c))
    };
    if ![host, ns, model, tag].iter().all(|s| ok(s)) {
        return Err(format!(
            "'{name}' is not an Ollama model name (model[:tag])"
        ));
    }
    Ok(Path::new(host).join(ns).join(model).join(tag))
}

/// The GGUF blob of Ollama model `name` (`model[:tag]`).
pub fn resolve(name: &str) -> Result<PathBuf, AssetError> {
    let fail = |why: String| AssetError::Convert {
        what: format!("ollama:{name}"),
        why,
    };
    let rel = manifest_path(name).map_err(fail)?;
    let searched = stores();
    let Some((store, manifest)) = searched
        .iter()
        .map(|s| (s, s.join("manifests").join(&rel)))
        .find(|(_, m)| m.is_file())
    else {
        let where_ = searched
            .iter()
            .map(|s| s.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(fail(format!(
            "no manifest manifests/{} in {where_} (pull it with `ollama pull {name}`, or set \
             OLLAMA_MODELS)",
            rel.display()
        )));
    };
    let text = std::fs::read_to_string(&manifest).map_err(crate::io_err(&manifest))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| fail(format!("{}: not JSON: {e}", manifest.display())))?;
    let layers = v["layers"]
        .as_array()
        .ok_or_else(|| fail(format!("{}: no layers", manifest.display())))?;
    let digest = layers
        .iter()
        .find(|l| l["mediaType"] == MODEL_LAYER)
        .and_then(|l| l["digest"].as_str())
        .ok_or_else(|| fail(format!("{}: no model layer", manifest.display())))?;
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| fail(format!("{}: digest '{digest}'", manifest.display())))?;
    // Blobs are `sha256-HEX` (older stores on some systems: `sha256:HEX`).
    let blobs = store.join("blobs");
    [format!("sha256-{hex}"), format!("sha256:{hex}")]
        .iter()
        .map(|n| blobs.join(n))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            fail(format!(
                "its model blob sha256-{hex} is missing from {}",
                blobs.display()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::manifest_path;
    use std::path::Path;

    #[test]
    fn names_as_ollama_reads_them() {
        let p = |n: &str| manifest_path(n).unwrap();
        assert_eq!(
            p("qwen3"),
            Path::new("registry.ollama.ai/library/qwen3/latest")
        );
        assert_eq!(
            p("qwen3:4b"),
            Path::new("registry.ollama.ai/library/qwen3/4b")
        );
        assert_eq!(p("me/tiny:q4"), Path::new("registry.ollama.ai/me/tiny/q4"));
        assert_eq!(p("hf.co/org/m:Q4_K_M"), Path::new("hf.co/org/m/Q4_K_M"));
        for bad in ["", "../x", "a/b/c/d", "x:../../etc", "a b"] {
            assert!(manifest_path(bad).is_err(), "{bad}");
        }
    }
}
