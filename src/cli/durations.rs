//! Durations on the command line: a whole number and a unit (`10s`, `4000ms`, `10m`, `1h`).

use std::time::Duration;

pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    if s.trim_end_matches(['s', 'm', 'h']) == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = number.parse().map_err(|_| format!("{s:?} is not a duration like 10s, 4000ms, 10m or 1h"))?;
    let too_long = || format!("{s:?} is too long a duration");
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_long)?),
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use ms, s, m or h")),
    };
    if d.is_zero() {
        return Err("the duration must be more than zero".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_units_the_examples_use_and_refuse_the_rest_clearly() {
        assert_eq!(parse_duration("4000ms"), Ok(Duration::from_millis(4000)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_timeout("0h"), Ok(Duration::ZERO));
        assert!(parse_duration("2d").is_err_and(|e| e.contains("use ms, s, m or h")));
        assert!(parse_duration("99999999999999999999h").is_err_and(|e| e.contains("like 10s")));
        assert!(parse_duration("9999999999999999h").is_err_and(|e| e.contains("too long")));
        assert!(parse_duration("0s").is_err());
    }
}
