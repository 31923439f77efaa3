//! A neural letter-to-sound model for words no lexicon holds: the GRU encoder-decoder of the
//! `g2p-en` package (its `checkpoint20.npz`, Apache-2.0), run natively. The encoder reads
//! the word's letters and an end mark; the decoder, started from the encoder's last state,
//! emits ARPAbet phones greedily until its end mark (20 at most), which are then written in
//! Kokoro's phoneme set with the stress marks before the stressed vowel, as misaki's
//! lexicons write them.

use std::path::Path;

use kiln_formats::{read_npz, NpyArray};

use super::g2p::G2pError;

/// The decoder's phones after its four specials (`<pad>`, `<unk>`, `<s>`, `</s>`).
const PHONES: [&str; 70] = [
    "AA0", "AA1", "AA2", "AE0", "AE1", "AE2", "AH0", "AH1", "AH2", "AO0", "AO1", "AO2", "AW0",
    "AW1", "AW2", "AY0", "AY1", "AY2", "B", "CH", "D", "DH", "EH0", "EH1", "EH2", "ER0", "ER1",
    "ER2", "EY0", "EY1", "EY2", "F", "G", "HH", "IH0", "IH1", "IH2", "IY0", "IY1", "IY2", "JH",
    "K", "L", "M", "N", "NG", "OW0", "OW1", "OW2", "OY0", "OY1", "OY2", "P", "R", "S", "SH", "T",
    "TH", "UH0", "UH1", "UH2", "UW", "UW0", "UW1", "UW2", "V", "W", "Y", "Z", "ZH",
];
const START: usize = 2;
const END: usize = 3;
const MAX_PHONES: usize = 20;

/// One GRU layer's weights (PyTorch's gate order: reset, update, new).
struct Gru {
    w_ih: Vec<f32>,
    w_hh: Vec<f32>,
    b_ih: Vec<f32>,
    b_hh: Vec<f32>,
    input: usize,
    hidden: usize,
}

fn matvec(w: &[f32], x: &[f32], b: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .zip(b)
        .map(|(row, b)| b + row.iter().zip(x).map(|(a, c)| a * c).sum::<f32>())
        .collect()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Gru {
    fn step(&self, x: &[f32], h: &mut [f32]) {
        let n = self.hidden;
        let gi = matvec(&self.w_ih, x, &self.b_ih);
        let gh = matvec(&self.w_hh, h, &self.b_hh);
        for j in 0..n {
            let r = sigmoid(gi[j] + gh[j]);
            let z = sigmoid(gi[n + j] + gh[n + j]);
            let c = (gi[2 * n + j] + r * gh[2 * n + j]).tanh();
            h[j] = (1.0 - z) * c + z * h[j];
        }
    }
}

/// The model's weights.
pub struct NeuralG2p {
    enc_emb: Vec<f32>,
    enc: Gru,
    dec_emb: Vec<f32>,
    dec: Gru,
    fc_w: Vec<f32>,
    fc_b: Vec<f32>,
    emb: usize,
}

impl NeuralG2p {
    /// Reads `checkpoint20.npz`.
    pub fn load(path: &Path) -> Result<Self, G2pError> {
        let err = |what: String| G2pError::Lexicon {
            path: path.to_path_buf(),
            what,
        };
        let arrays = read_npz(path).map_err(|e| err(e.to_string()))?;
        let get = |name: &str, rank: usize| -> Result<&NpyArray, G2pError> {
            let a = arrays
                .iter()
                .find(|(n, _)| n.trim_end_matches(".npy") == name)
                .map(|(_, a)| a)
                .ok_or_else(|| err(format!("no array '{name}'")))?;
            if a.shape.len() != rank {
                return Err(err(format!("'{name}' has shape {:?}", a.shape)));
            }
            Ok(a)
        };
        let enc_emb = get("enc_emb", 2)?;
        let emb = enc_emb.shape[1];
        let hidden = get("enc_w_hh", 2)?.shape[1];
        let gru = |p: &str| -> Result<Gru, G2pError> {
            let g = Gru {
                w_ih: get(&format!("{p}_w_ih"), 2)?.data.clone(),
                w_hh: get(&format!("{p}_w_hh"), 2)?.data.clone(),
                b_ih: get(&format!("{p}_b_ih"), 1)?.data.clone(),
                b_hh: get(&format!("{p}_b_hh"), 1)?.data.clone(),
                input: emb,
                hidden,
            };
            let n3 = 3 * hidden;
            if g.w_ih.len() != n3 * emb
                || g.w_hh.len() != n3 * hidden
                || g.b_ih.len() != n3
                || g.b_hh.len() != n3
            {
                return Err(err(format!("the {p} GRU's shapes disagree")));
            }
            Ok(g)
        };
        let dec_emb = get("dec_emb", 2)?;
        let (fc_w, fc_b) = (get("fc_w", 2)?, get("fc_b", 1)?);
        let phones = 4 + PHONES.len();
        if enc_emb.shape[0] != 29
            || dec_emb.shape != [phones, emb]
            || fc_w.shape != [phones, hidden]
            || fc_b.shape != [phones]
        {
            return Err(err("embedding or output shapes are not g2p-en's".into()));
        }
        Ok(NeuralG2p {
            enc_emb: enc_emb.data.clone(),
            enc: gru("enc")?,
            dec_emb: dec_emb.data.clone(),
            dec: gru("dec")?,
            fc_w: fc_w.data.clone(),
            fc_b: fc_b.data.clone(),
            emb,
        })
    }

    /// ARPAbet phones of `word` (letters a-z; others are skipped).
    pub fn arpabet(&self, word: &str) -> Vec<&'static str> {
        // Graphemes: <pad>, <unk>, </s>, then a..z.
        let mut ids: Vec<usize> = word
            .chars()
            .filter(|c| c.is_ascii_alphabetic())
            .map(|c| 3 + (c.to_ascii_lowercase() as u8 - b'a') as usize)
            .collect();
        if ids.is_empty() {
            return Vec::new();
        }
        ids.push(2);
        let e = self.emb;
        let mut h = vec![0f32; self.enc.hidden];
        for &id in &ids {
            self.enc.step(&self.enc_emb[id * e..(id + 1) * e], &mut h);
        }
        debug_assert_eq!(self.enc.input, self.dec.input);
        let mut out = Vec::new();
        let mut prev = START;
        for _ in 0..MAX_PHONES {
            self.dec
                .step(&self.dec_emb[prev * e..(prev + 1) * e], &mut h);
            let logits = matvec(&self.fc_w, &h, &self.fc_b);
            let best = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap_or(END);
            if best == END {
                break;
            }
            if let Some(p) = best.checked_sub(4).and_then(|i| PHONES.get(i)) {
                out.push(*p);
            }
            prev = best;
        }
        out
    }

    /// `word` in Kokoro's phonemes.
    pub fn phonemes(&self, word: &str) -> String {
        arpabet_to_kokoro(&self.arpabet(word))
    }
}

/// ARPAbet phones in Kokoro's (misaki's American) phoneme set: `ˈ`/`ˌ` before a vowel of
/// primary/secondary stress; diphthongs as misaki's single letters (A = eɪ, I = aɪ, O = oʊ,
/// W = aʊ, Y = ɔɪ); unstressed AH and ER reduced (ə, əɹ).
pub fn arpabet_to_kokoro(phones: &[&str]) -> String {
    let mut out = String::new();
    for p in phones {
        let (base, stress) = match p.as_bytes().last() {
            Some(d @ b'0'..=b'2') => (&p[..p.len() - 1], Some(d - b'0')),
            _ => (*p, None),
        };
        let s = match base {
            "AA" => "ɑ",
            "AE" => "æ",
            "AH" if stress == Some(0) => "ə",
            "AH" => "ʌ",
            "AO" => "ɔ",
            "AW" => "W",
            "AY" => "I",
            "EH" => "ɛ",
            "ER" if stress == Some(0) => "əɹ",
            "ER" => "ɜɹ",
            "EY" => "A",
            "IH" => "ɪ",
            "IY" => "i",
            "OW" => "O",
            "OY" => "Y",
            "UH" => "ʊ",
            "UW" => "u",
            "B" => "b",
            "CH" => "ʧ",
            "D" => "d",
            "DH" => "ð",
            "F" => "f",
            "G" => "ɡ",
            "HH" => "h",
            "JH" => "ʤ",
            "K" => "k",
            "L" => "l",
            "M" => "m",
            "N" => "n",
            "NG" => "ŋ",
            "P" => "p",
            "R" => "ɹ",
            "S" => "s",
            "SH" => "ʃ",
            "T" => "t",
            "TH" => "θ",
            "V" => "v",
            "W" => "w",
            "Y" => "j",
            "Z" => "z",
            "ZH" => "ʒ",
            _ => "",
        };
        match stress {
            Some(1) => out.push('ˈ'),
            Some(2) => out.push('ˌ'),
            _ => {}
        }
        out.push_str(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::arpabet_to_kokoro;

    /// The lexicon's own spellings of words whose ARPAbet is known (CMUdict).
    #[test]
    fn arpabet_maps_to_the_lexicons_phonemes() {
        for (arpa, kokoro) in [
            ("K AE1 T", "kˈæt"),
            ("AH0 B AW1 T", "əbˈWt"),
            ("B AH1 T ER0", "bˈʌtəɹ"),
            ("HH AH0 L OW1", "həlˈO"),
            ("CH ER1 CH", "ʧˈɜɹʧ"),
            ("M EH1 ZH ER0", "mˈɛʒəɹ"),
            ("B OY1", "bˈY"),
            ("JH AH1 JH", "ʤˈʌʤ"),
            ("T UW1", "tˈu"),
        ] {
            let phones: Vec<&str> = arpa.split(' ').collect();
            assert_eq!(arpabet_to_kokoro(&phones), kokoro, "{arpa}");
        }
    }
}
