//! A Hugging Face `generation_config.json`: the model's own sampling defaults (used where the
//! user sets none) and its end-of-generation ids.

use std::path::Path;

use serde_json::Value as Json;

use crate::sampler::SamplerConfig;
use crate::RuntimeError;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// `do_sample: false` means greedy.
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub eos_ids: Vec<u32>,
}

impl GenerationDefaults {
    /// Reads `generation_config.json` in `dir`; absent file: no defaults.
    pub fn from_dir(dir: &Path) -> Result<Self, RuntimeError> {
        let path = dir.join("generation_config.json");
        if !path.is_file() {
            return Ok(Self::default());
        }
        let err = |what: String| RuntimeError::Path {
            path: path.clone(),
            what,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
        let v: Json = serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
        let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
        let eos_ids = match v.get("eos_token_id") {
            Some(Json::Number(n)) => n.as_u64().map(|i| i as u32).into_iter().collect(),
            Some(Json::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_u64())
                .map(|i| i as u32)
                .collect(),
            _ => Vec::new(),
        };
        Ok(GenerationDefaults {
            do_sample: v.get("do_sample").and_then(|x| x.as_bool()),
            temperature: f("temperature"),
            top_k: v.get("top_k").and_then(|x| x.as_u64()).map(|x| x as usize),
            top_p: f("top_p"),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
            eos_ids,
        })
    }

    /// `base` (kiln's defaults) with the model's values laid over it.
    pub fn apply(&self, base: &SamplerConfig) -> SamplerConfig {
        let mut c = base.clone();
        if let Some(t) = self.temperature {
            c.temperature = t;
        }
        if self.do_sample == Some(false) {
            c.temperature = 0.0;
        }
        if let Some(k) = self.top_k {
            c.top_k = k;
        }
        if let Some(p) = self.top_p {
            c.top_p = p;
        }
        if let Some(p) = self.min_p {
            c.min_p = p;
        }
        if let Some(r) = self.repetition_penalty {
            c.repeat_penalty = r;
        }
        c
    }
}
