//! The process's own metrics under the names every Prometheus client library exports
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …), read from `/proc/self` at
//! each scrape, so that dashboards and alerts written for any exporter work on the operator.
//! Linux only; elsewhere (the CLI on macOS never serves metrics) nothing is exported.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

#[derive(Debug, Default)]
pub struct ProcessMetrics;

/// What `/proc/self` says of this process.
#[derive(Debug, PartialEq)]
struct Reading {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    start_time_seconds: f64,
    open_fds: i64,
    threads: i64,
}

/// The fields of `/proc/self/stat` after the command name (which may hold spaces and
/// parentheses, so the text is cut at its last `)`): field 3 of proc(5) is the first.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// A reading from the texts of `/proc/self/stat` and `/proc/stat` (pure).
fn parse(stat: &str, proc_stat: &str, ticks_per_second: u64, page_size: usize, open_fds: i64) -> Option<Reading> {
    let fields = stat_fields(stat)?;
    // proc(5) numbers fields from 1: utime is 14, stime 15, num_threads 20, starttime 22,
    // vsize 23, rss 24; `fields` starts at field 3.
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let ticks = ticks_per_second.max(1) as f64;
    let boot_time: u64 = proc_stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    Some(Reading {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        threads: field(20)? as i64,
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks,
        virtual_bytes: field(23)? as i64,
        resident_bytes: (field(24)? as i64).saturating_mul(page_size as i64),
        open_fds,
    })
}

fn read() -> Option<Reading> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let proc_stat = std::fs::read_to_string("/proc/stat").ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    parse(&stat, &proc_stat, rustix::param::clock_ticks_per_second(), rustix::param::page_size(), open_fds)
}

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = read() else { return Ok(()) };
        let cpu = encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(r.cpu_seconds).encode(cpu)?;
        for (name, help, value) in [
            ("process_resident_memory_bytes", "Resident memory size", r.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size", r.virtual_bytes),
            ("process_open_fds", "Open file descriptors", r.open_fds),
            ("process_threads", "OS threads", r.threads),
        ] {
            ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        let start = "Start time of the process since the Unix epoch";
        ConstGauge::new(r.start_time_seconds).encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            start,
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_reads_whatever_the_command_name_holds() {
        // A command name with a space and a parenthesis, as proc(5) allows.
        let stat = "4242 (zk lock) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 7 0 1000 \
                    123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let reading = parse(stat, "cpu 1 2 3\nbtime 1700000000\n", 100, 4096, 9).unwrap();
        assert_eq!(
            reading,
            Reading {
                cpu_seconds: 3.0,
                resident_bytes: 2048 * 4096,
                virtual_bytes: 123_456_789,
                start_time_seconds: 1_700_000_010.0,
                open_fds: 9,
                threads: 7,
            }
        );
        assert!(parse("garbage", "btime 1", 100, 4096, 0).is_none());
    }

    #[test]
    fn this_process_reads_itself() {
        let r = read().expect("/proc/self");
        assert!(r.resident_bytes > 0 && r.open_fds > 0 && r.threads >= 1, "{r:?}");
    }
}
