//! Replays an engine trace (recorded with `ferrolm serve --record-trace PATH` or
//! `Engine(record_trace=PATH)`) through the Rust core alone, the recorded tokens standing
//! in for the model. Prints each step's decisions (prefill and chunks, cache hits,
//! decodes, retractions, finishes, KV use), then a summary; checks KV conservation after
//! every step and that no slot is left held at the end.
//!
//! ```text
//! ferrolm-replay TRACE [-q] [--by-time [--step-ms X] [--token-ms Y]] [--check-every N]
//!                [--expect-same] [--timing] [--kv-capacity N] [--max-running-requests N]
//!                [--max-prefill-tokens N] [--schedule-policy P] [--eviction-policy P]
//!                [--disable-radix-cache] [--new-token-ratio R]
//! ```
//!
//! Exit status: 0 the checks held; 1 a KV check failed (or the engine stalled); 2 bad
//! arguments or an unreadable trace; 3 with `--expect-same`, the replay scheduled or ended
//! something otherwise than recorded. `FERROLM_LOG=debug` adds the core's own events.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use ferrolm_core::trace::{replay, Arrivals, ReplayOptions, Trace};

const USAGE: &str = "usage: ferrolm-replay TRACE [-q] [--by-time [--step-ms X] [--token-ms Y]] [--check-every N] \
[--expect-same] [--timing] [--kv-capacity N] [--max-running-requests N] [--max-prefill-tokens N] [--schedule-policy P] \
[--eviction-policy P] [--disable-radix-cache] [--new-token-ratio R]";

struct Args {
    path: PathBuf,
    options: ReplayOptions,
    expect_same: bool,
    /// Print how long reading and replaying took (the core's own cost per step).
    timing: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let mut options = ReplayOptions { verbose: true, ..ReplayOptions::default() };
    let (mut by_time, mut step_ms, mut token_ms) = (false, None, 0.0);
    let (mut expect_same, mut timing) = (false, false);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        fn num<T: std::str::FromStr>(name: &str, v: String) -> Result<T, String>
        where
            T::Err: std::fmt::Display,
        {
            v.parse().map_err(|e| format!("{name}: {v:?}: {e}"))
        }
        let o = &mut options.overrides;
        match arg.as_str() {
            "-q" | "--quiet" => options.verbose = false,
            "--by-time" => by_time = true,
            "--step-ms" => step_ms = Some(num::<f64>("--step-ms", value("--step-ms")?)?),
            "--token-ms" => token_ms = num::<f64>("--token-ms", value("--token-ms")?)?,
            "--check-every" => options.check_every = num("--check-every", value("--check-every")?)?,
            "--expect-same" => expect_same = true,
            "--timing" => timing = true,
            "--kv-capacity" => o.kv_capacity = Some(num("--kv-capacity", value("--kv-capacity")?)?),
            "--max-running-requests" => {
                o.max_running_requests =
                    Some(num("--max-running-requests", value("--max-running-requests")?)?)
            }
            "--max-prefill-tokens" | "--chunked-prefill-size" => {
                o.max_prefill_tokens = Some(num(&arg, value(&arg)?)?)
            }
            "--schedule-policy" => o.schedule_policy = Some(value("--schedule-policy")?.parse()?),
            "--eviction-policy" => {
                o.eviction_policy = Some(value("--eviction-policy")?.parse().map_err(|e| format!("{e}"))?)
            }
            "--disable-radix-cache" => o.enable_prefix_cache = Some(false),
            "--new-token-ratio" => {
                o.new_token_ratio = Some(num("--new-token-ratio", value("--new-token-ratio")?)?)
            }
            "-h" | "--help" => return Err(String::new()),
            other if path.is_none() && !other.starts_with('-') => path = Some(PathBuf::from(other)),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if by_time {
        let step_s = step_ms.map(|ms: f64| ms / 1e3);
        options.arrivals = Arrivals::Time { step_s, token_s: token_ms / 1e3 };
    } else if step_ms.is_some() || token_ms != 0.0 {
        return Err("--step-ms and --token-ms are for --by-time".into());
    }
    Ok(Args { path: path.ok_or("missing the trace file")?, options, expect_same, timing })
}

fn main() -> ExitCode {
    ferrolm_core::logging::init_from_env();
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("error: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let trace = match Trace::open(&args.path) {
        Ok(t) => t,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };
    let read = started.elapsed();
    let summary = match replay(&trace, &args.options, &mut |line| println!("{line}")) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };
    let replayed = started.elapsed() - read;
    for line in summary.report() {
        println!("{line}");
    }
    if args.timing {
        println!(
            "time: read {:.1} ms, replay {:.1} ms ({:.2} us per step)",
            read.as_secs_f64() * 1e3,
            replayed.as_secs_f64() * 1e3,
            replayed.as_secs_f64() * 1e6 / summary.steps.max(1) as f64
        );
    }
    let code = summary.exit_code(args.expect_same);
    if code == 3 {
        eprintln!("the replay differs from the recording (--expect-same)");
    }
    ExitCode::from(code)
}
