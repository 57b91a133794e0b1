//! Durations on the command line, in jiff's friendly format (`10s`, `4000ms`, `10m`, `1h30m`,
//! `1.5s`); a bare number is seconds.

use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;

pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    match parse(s)? {
        d if d.is_zero() => Ok(Duration::ZERO),
        d => Ok(d),
    }
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    match parse(s)? {
        d if d.is_zero() => Err("the duration must be more than zero".into()),
        d => Ok(d),
    }
}

fn parse(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let hint = "a duration like 10s, 4000ms, 10m, 1h or 1h30m";
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map(Duration::from_secs).map_err(|_| format!("{s:?} is too long a duration"));
    }
    let signed: SignedDuration = text.parse().map_err(|e| format!("{s:?} is not {hint}: {e}"))?;
    Duration::try_from(signed).map_err(|_| format!("{s:?} is negative: give {hint}"))
}

/// How long, to the unit that matters: `3s`, `4m12s`, `2h5m`, `3d4h`.
pub fn brief(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_durations_keep_the_two_units_that_matter() {
        let cases = [(0, "0s"), (59, "59s"), (60, "1m0s"), (252, "4m12s"), (7500, "2h5m"), (273_600, "3d4h")];
        for (secs, text) in cases {
            assert_eq!(brief(Duration::from_secs(secs)), text);
        }
    }

    #[test]
    fn durations_take_the_units_the_examples_use_and_refuse_the_rest_clearly() {
        assert_eq!(parse_duration("4000ms"), Ok(Duration::from_millis(4000)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("0h"), Ok(Duration::ZERO));
        assert_eq!(parse_timeout("0"), Ok(Duration::ZERO));
        assert!(
            parse_duration("2 fortnights").is_err_and(|e| e.contains("like 10s")),
            "{:?}",
            parse_duration("2 fortnights")
        );
        assert!(parse_duration("-5s").is_err_and(|e| e.contains("negative")), "{:?}", parse_duration("-5s"));
        assert!(parse_duration("99999999999999999999").is_err_and(|e| e.contains("too long")));
        assert!(parse_duration("99999999999999999999h").is_err_and(|e| e.contains("like 10s")));
        assert!(parse_duration("0s").is_err_and(|e| e.contains("more than zero")));
        assert!(parse_duration("").is_err());
    }
}
