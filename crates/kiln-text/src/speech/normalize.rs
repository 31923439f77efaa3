//! Text normalisation for speech: numbers, ordinals, years, decimals, currency, percentages,
//! times, ISO dates, common abbreviations, URLs and e-mail addresses become words; then the
//! text is split into sentences.

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Cardinal number in words (up to 10^15 - 1; larger numbers are read digit by digit).
pub fn cardinal(n: u64) -> String {
    fn below_1000(n: u64, out: &mut Vec<String>) {
        let (h, r) = (n / 100, n % 100);
        if h > 0 {
            out.push(format!("{} hundred", ONES[h as usize]));
        }
        if r > 0 {
            if r < 20 {
                out.push(ONES[r as usize].into());
            } else if r % 10 == 0 {
                out.push(TENS[(r / 10) as usize].into());
            } else {
                out.push(format!(
                    "{}-{}",
                    TENS[(r / 10) as usize],
                    ONES[(r % 10) as usize]
                ));
            }
        }
    }
    if n == 0 {
        return "zero".into();
    }
    if n >= 1_000_000_000_000_000 {
        return digits(&n.to_string());
    }
    let mut out = Vec::new();
    for (scale, name) in [
        (1_000_000_000_000u64, "trillion"),
        (1_000_000_000, "billion"),
        (1_000_000, "million"),
        (1_000, "thousand"),
    ] {
        if n / scale % 1000 > 0 {
            below_1000(n / scale % 1000, &mut out);
            out.push(name.into());
        }
    }
    below_1000(n % 1000, &mut out);
    out.join(" ")
}

/// "first", "twenty-second", ...
pub fn ordinal(n: u64) -> String {
    let c = cardinal(n);
    let (head, last) = match c.rfind([' ', '-']) {
        Some(i) => (&c[..=i], &c[i + 1..]),
        None => ("", c.as_str()),
    };
    let last = match last {
        "one" => "first".to_string(),
        "two" => "second".into(),
        "three" => "third".into(),
        "five" => "fifth".into(),
        "eight" => "eighth".into(),
        "nine" => "ninth".into(),
        "twelve" => "twelfth".into(),
        l if l.ends_with('y') => format!("{}ieth", &l[..l.len() - 1]),
        l => format!("{l}th"),
    };
    format!("{head}{last}")
}

/// A four-digit year as people say it: 1984 "nineteen eighty-four", 2005 "two thousand five".
pub fn year(n: u64) -> String {
    if !(1000..10000).contains(&n) || (2000..2010).contains(&n) || n % 1000 == 0 {
        return cardinal(n);
    }
    let (hi, lo) = (n / 100, n % 100);
    match lo {
        0 => format!("{} hundred", cardinal(hi)),
        1..=9 => format!("{} oh {}", cardinal(hi), cardinal(lo)),
        _ => format!("{} {}", cardinal(hi), cardinal(lo)),
    }
}

fn digits(s: &str) -> String {
    s.chars()
        .filter_map(|c| c.to_digit(10))
        .map(|d| ONES[d as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

fn abbreviation(w: &str) -> Option<&'static str> {
    Some(match w {
        "Mr." => "mister",
        "Mrs." => "missus",
        "Ms." => "miz",
        "Dr." => "doctor",
        "Prof." => "professor",
        "St." => "saint",
        "Jr." => "junior",
        "Sr." => "senior",
        "vs." => "versus",
        "etc." => "etcetera",
        "e.g." => "for example",
        "i.e." => "that is",
        "approx." => "approximately",
        "No." => "number",
        "Inc." => "incorporated",
        "Ltd." => "limited",
        "Co." => "company",
        "Jan." => "January",
        "Feb." => "February",
        "Aug." => "August",
        "Sept." | "Sep." => "September",
        "Oct." => "October",
        "Nov." => "November",
        "Dec." => "December",
        _ => return None,
    })
}

/// Reads a URL or e-mail address: "example dot com slash docs".
fn url(w: &str) -> String {
    let w = w
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_start_matches("www.");
    let mut out = String::new();
    for c in w.chars() {
        match c {
            '.' => out.push_str(" dot "),
            '/' => out.push_str(" slash "),
            '@' => out.push_str(" at "),
            '-' => out.push_str(" dash "),
            '_' => out.push_str(" underscore "),
            ':' => out.push_str(" colon "),
            c if c.is_ascii_digit() => {
                out.push(' ');
                out.push_str(ONES[c.to_digit(10).unwrap_or(0) as usize]);
                out.push(' ');
            }
            c => out.push(c),
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A number token (digits with optional thousands commas and a decimal part) in words.
pub fn number(tok: &str) -> Option<String> {
    let t = tok.replace(',', "");
    let (int, frac) = match t.split_once('.') {
        Some((a, b)) => (a, Some(b)),
        None => (t.as_str(), None),
    };
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if frac.is_some_and(|f| f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let n: u64 = int.parse().ok()?;
    let mut s = if int.len() > 1 && int.starts_with('0') {
        digits(int)
    } else {
        cardinal(n)
    };
    if let Some(f) = frac {
        s = format!("{s} point {}", digits(f));
    }
    Some(s)
}

fn money(tok: &str) -> Option<String> {
    let (unit, sub, rest) = match tok.chars().next()? {
        '$' => (("dollar", "dollars"), ("cent", "cents"), &tok[1..]),
        '£' => (
            ("pound", "pounds"),
            ("penny", "pence"),
            &tok['£'.len_utf8()..],
        ),
        '€' => (("euro", "euros"), ("cent", "cents"), &tok['€'.len_utf8()..]),
        _ => return None,
    };
    let t = rest.replace(',', "");
    let (int, frac) = t.split_once('.').unwrap_or((&t, ""));
    let n: u64 = int.parse().ok()?;
    let mut s = format!("{} {}", cardinal(n), if n == 1 { unit.0 } else { unit.1 });
    if !frac.is_empty() {
        let c: u64 = format!("{frac:0<2}")[..2].parse().ok()?;
        if c > 0 {
            s = format!(
                "{s} and {} {}",
                cardinal(c),
                if c == 1 { sub.0 } else { sub.1 }
            );
        }
    }
    Some(s)
}

/// One whitespace-separated token, with its trailing punctuation kept.
fn word(tok: &str, next: Option<&str>) -> String {
    if let Some(a) = abbreviation(tok) {
        return a.into();
    }
    if tok.contains("://") || tok.starts_with("www.") || (tok.contains('@') && tok.contains('.')) {
        let core = tok.trim_end_matches(['.', ',', '!', '?', ';', ':']);
        return format!("{}{}", url(core), &tok[core.len()..]);
    }
    let core = tok.trim_end_matches(['.', ',', '!', '?', ';', ':', ')', '"']);
    let tail = &tok[core.len()..];
    let lead_end = core
        .find(|c: char| c != '(' && c != '"')
        .unwrap_or(core.len());
    let (lead, core) = core.split_at(lead_end);
    let spoken = (|| {
        if let Some(m) = money(core) {
            return Some(m);
        }
        if let Some(p) = core.strip_suffix('%') {
            return number(p).map(|n| format!("{n} percent"));
        }
        // Times: 3:30, 12:05pm
        let low = core.to_ascii_lowercase();
        let (clock, ampm) = match low.strip_suffix("am").or_else(|| low.strip_suffix("a.m.")) {
            Some(c) => (c.to_string(), Some("a m")),
            None => match low.strip_suffix("pm").or_else(|| low.strip_suffix("p.m.")) {
                Some(c) => (c.to_string(), Some("p m")),
                None => (low.clone(), None),
            },
        };
        if let Some((h, m)) = clock.split_once(':') {
            if let (Ok(h), Ok(mi)) = (h.parse::<u64>(), m.parse::<u64>()) {
                if h < 24 && mi < 60 && m.len() == 2 {
                    let mut s = cardinal(h);
                    if mi == 0 {
                        if ampm.is_none() {
                            s.push_str(" o'clock");
                        }
                    } else if mi < 10 {
                        s = format!("{s} oh {}", cardinal(mi));
                    } else {
                        s = format!("{s} {}", cardinal(mi));
                    }
                    if let Some(a) = ampm {
                        s = format!("{s} {a}");
                    }
                    return Some(s);
                }
            }
        }
        // ISO dates: 2024-03-15
        let parts: Vec<&str> = core.split('-').collect();
        if parts.len() == 3
            && parts[0].len() == 4
            && parts
                .iter()
                .all(|p| p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty())
        {
            let (y, m, d) = (
                parts[0].parse().ok()?,
                parts[1].parse::<usize>().ok()?,
                parts[2].parse().ok()?,
            );
            if (1..=12).contains(&m) && (1..=31).contains(&d) {
                return Some(format!("{} {}, {}", MONTHS[m - 1], ordinal(d), year(y)));
            }
        }
        // Dates with slashes: month/day/year (12/05/2024, 7/4/76), day/month/year where
        // the first number cannot be a month (25/12/2024).
        let parts: Vec<&str> = core.split('/').collect();
        if parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
            && matches!(parts[2].len(), 2 | 4)
        {
            let (a, b) = (
                parts[0].parse::<usize>().ok()?,
                parts[1].parse::<u64>().ok()?,
            );
            let y: u64 = parts[2].parse().ok()?;
            let (m, d) = match (a, b) {
                (1..=12, 1..=31) => (a, b),
                (13..=31, 1..=12) => (b as usize, a as u64),
                _ => return None,
            };
            // Two-digit years: 1950..2049.
            let y = match parts[2].len() {
                2 if y < 50 => 2000 + y,
                2 => 1900 + y,
                _ => y,
            };
            return Some(format!("{} {}, {}", MONTHS[m - 1], ordinal(d), year(y)));
        }
        // Ordinals: 1st, 22nd, 3rd, 4th
        for suf in ["st", "nd", "rd", "th"] {
            if let Some(n) = core.strip_suffix(suf) {
                if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                    return n.parse().ok().map(ordinal);
                }
            }
        }
        // Years: a bare 4-digit number in 1100..2099 (not followed by a unit-like word).
        if core.len() == 4 && core.bytes().all(|b| b.is_ascii_digit()) {
            let n: u64 = core.parse().ok()?;
            let counted = next.is_some_and(|w| {
                matches!(
                    w.trim_end_matches(['.', ',']),
                    "people" | "times" | "items" | "units" | "dollars" | "miles" | "meters"
                )
            });
            if (1100..2100).contains(&n) && !counted {
                return Some(year(n));
            }
        }
        number(core)
    })();
    match spoken {
        Some(s) => format!("{lead}{s}{tail}"),
        None => {
            // Letters and digits glued together ("MP3", "4K"): read the digits as numbers.
            if core.chars().any(|c| c.is_ascii_digit()) && core.chars().any(|c| c.is_alphabetic()) {
                let mut out = String::new();
                let mut num = String::new();
                for c in core.chars() {
                    if c.is_ascii_digit() {
                        num.push(c);
                    } else {
                        if !num.is_empty() {
                            out.push_str(&format!(" {} ", number(&num).unwrap_or_default()));
                            num.clear();
                        }
                        out.push(c);
                    }
                }
                if !num.is_empty() {
                    out.push_str(&format!(" {}", number(&num).unwrap_or_default()));
                }
                return format!(
                    "{lead}{}{tail}",
                    out.split_whitespace().collect::<Vec<_>>().join(" ")
                );
            }
            tok.replace('&', " and ")
        }
    }
}

/// Normalised text: every token spoken as words.
pub fn normalize(text: &str) -> String {
    let toks: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::with_capacity(toks.len());
    for (i, t) in toks.iter().enumerate() {
        if *t == "&" {
            out.push("and".to_string());
            continue;
        }
        out.push(word(t, toks.get(i + 1).copied()));
    }
    out.join(" ")
}

/// Sentences of `text` (split after . ! ? … followed by a space and a capital, digit or quote,
/// and at line breaks), each trimmed, empty ones dropped. Abbreviations do not end sentences.
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for para in text.split('\n') {
        let toks: Vec<&str> = para.split_whitespace().collect();
        let mut cur: Vec<&str> = Vec::new();
        for (i, t) in toks.iter().enumerate() {
            cur.push(t);
            let ends = t.ends_with(['.', '!', '?', '…'])
                || t.ends_with(".\"")
                || t.ends_with("?\"")
                || t.ends_with("!\"");
            let next_starts = toks
                .get(i + 1)
                .and_then(|n| n.chars().next())
                .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit() || c == '"' || c == '“');
            if ends && next_starts && abbreviation(t).is_none() && !is_initial(t) {
                out.push(cur.join(" "));
                cur.clear();
            }
        }
        if !cur.is_empty() {
            out.push(cur.join(" "));
        }
    }
    out.retain(|s| !s.trim().is_empty());
    out
}

/// "J." as in "J. R. R. Tolkien".
fn is_initial(t: &str) -> bool {
    let mut c = t.chars();
    matches!((c.next(), c.next(), c.next()), (Some(a), Some('.'), None) if a.is_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_forms() {
        assert_eq!(cardinal(0), "zero");
        assert_eq!(cardinal(42), "forty-two");
        assert_eq!(
            cardinal(1_234_567),
            "one million two hundred thirty-four thousand five hundred sixty-seven"
        );
        assert_eq!(ordinal(22), "twenty-second");
        assert_eq!(ordinal(40), "fortieth");
        assert_eq!(year(1984), "nineteen eighty-four");
        assert_eq!(year(2005), "two thousand five");
        assert_eq!(year(1905), "nineteen oh five");
        assert_eq!(
            normalize("It costs $12.50."),
            "It costs twelve dollars and fifty cents."
        );
        assert_eq!(
            normalize("Up 5%, at 3:30pm"),
            "Up five percent, at three thirty p m"
        );
        assert_eq!(
            normalize("On 2024-03-15 Dr. Smith"),
            "On March fifteenth, twenty twenty-four doctor Smith"
        );
        assert_eq!(
            normalize("the 3rd of 1,000 at 7:00"),
            "the third of one thousand at seven o'clock"
        );
        assert_eq!(normalize("pi is 3.14"), "pi is three point one four");
        assert_eq!(
            normalize("see https://example.com/docs."),
            "see example dot com slash docs."
        );
        assert_eq!(
            normalize("paid $3.50 on 12/05/2024, due 25/12/24 or 7/4/76."),
            "paid three dollars and fifty cents on December fifth, twenty twenty-four, \
             due December twenty-fifth, twenty twenty-four or July fourth, nineteen seventy-six."
        );
        assert_eq!(normalize("13/13/2024"), "13/13/2024");
        assert_eq!(
            normalize("In 1999 we had 2048 people"),
            "In nineteen ninety-nine we had two thousand forty-eight people"
        );
    }

    #[test]
    fn sentence_split() {
        let s = sentences("Hello there. Mr. Smith is here! Is he? Yes.\nNew line");
        assert_eq!(
            s,
            vec![
                "Hello there.",
                "Mr. Smith is here!",
                "Is he?",
                "Yes.",
                "New line"
            ]
        );
    }
}
