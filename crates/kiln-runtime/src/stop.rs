//! Stop strings over streamed text: text that might be the start of a stop string is held
//! back until it is known not to be.

pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds new text; returns the text safe to emit and whether a stop string was hit (the
    /// stop string and everything after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > hold && self.pending.ends_with(&s[..i]) {
                    hold = i;
                }
            }
        }
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Whatever is held back, at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_stops() {
        let mut m = StopMatcher::new(&["###".to_string(), "User:".to_string()]);
        assert_eq!(m.push("Hello #"), ("Hello ".to_string(), false));
        assert_eq!(m.push("# wor"), ("## wor".to_string(), false));
        assert_eq!(m.push("ld Us"), ("ld ".to_string(), false));
        assert_eq!(m.push("er: more"), ("".to_string(), true));
        let mut m = StopMatcher::new(&["é!".to_string()]);
        assert_eq!(m.push("café"), ("caf".to_string(), false));
        assert_eq!(m.flush(), "é");
    }
}
