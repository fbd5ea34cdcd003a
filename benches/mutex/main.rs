//! The tekton-mutex benchmark, run by `hack/bench.sh` against the local control plane.
//!
//! Every figure is measured from outside the controller: times from our own watches (and from
//! the deploy step itself), writes from the API server's `apiserver_request_total`, memory and
//! CPU from /proc. It prints a table and writes JSON under target/bench/.
//!
//!   cargo bench --bench mutex -- [--quick]
//!       [--only handover,lease,writes,throughput,burst,memory,free-keys,failover]
//!       [--handovers 100] [--queue 10] [--waiters 10,100,1000] [--grants 5] [--arrivals 10]
//!       [--keys 1000] [--runs-per-key 10] [--multi-key-waiters 1000] [--history 10000] [--free-keys 10000] [--kills 20] [--settle-ms 1500]

#[path = "../../tests/support/mod.rs"]
pub mod support;

mod apiserver;
mod burst;
mod failover;
mod free_keys;
mod handover;
mod lease;
mod memory;
mod objects;
mod plain_client;
mod report;
mod throughput;
mod watch;
mod writes;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use report::Table;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use support::controller::ControllerProcess;

const PARTS: &[&str] = &[
    "handover",
    "lease",
    "writes",
    "throughput",
    "burst",
    "memory",
    "free-keys",
    "failover",
];

/// Sizes, full by default; `--quick` scales everything down for a smoke run.
#[derive(Clone, Debug)]
pub struct Opts {
    pub parts: Vec<String>,
    pub handovers: usize,
    pub queue: usize,
    pub waiters: Vec<usize>,
    pub grants: usize,
    pub arrivals: usize,
    pub keys: usize,
    pub runs_per_key: usize,
    /// Runs of two keys each that the `burst` part queues behind held keys.
    pub multi_key_waiters: usize,
    pub history: usize,
    /// Distinct free-form keys of the `free-keys` part, one run each.
    pub free_keys: usize,
    /// How long after the free-keys part's last delete to measure its RSS once more (0: not).
    pub free_keys_linger: Duration,
    /// Leader kills of the `failover` part.
    pub kills: usize,
    pub settle: Duration,
    pub out: PathBuf,
    pub quick: bool,
}

impl Opts {
    fn full() -> Self {
        Opts {
            parts: PARTS.iter().map(|s| s.to_string()).collect(),
            handovers: 100,
            queue: 10,
            waiters: vec![10, 100, 1000],
            grants: 5,
            arrivals: 10,
            keys: 1000,
            runs_per_key: 10,
            multi_key_waiters: 1000,
            history: 10_000,
            free_keys: 10_000,
            free_keys_linger: Duration::ZERO,
            kills: 20,
            settle: Duration::from_millis(1500),
            out: support::repo_root().join("target/bench"),
            quick: false,
        }
    }

    fn quick(self) -> Self {
        Opts {
            handovers: 5,
            queue: 3,
            waiters: vec![10, 30],
            grants: 2,
            arrivals: 3,
            keys: 20,
            runs_per_key: 3,
            multi_key_waiters: 30,
            history: 200,
            free_keys: 200,
            kills: 3,
            settle: Duration::from_millis(1000),
            quick: true,
            ..self
        }
    }

    fn parse(args: &[String]) -> Result<Self> {
        let mut o = if args.iter().any(|a| a == "--quick") {
            Self::full().quick()
        } else {
            Self::full()
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().with_context(|| format!("{a} needs a value"));
            let num = |v: &String| {
                v.parse::<usize>()
                    .with_context(|| format!("{a} {v:?} is not a count"))
            };
            match a.as_str() {
                "--quick" | "--bench" => {}
                "--only" => {
                    o.parts = value()?.split(',').map(String::from).collect();
                    if let Some(p) = o.parts.iter().find(|p| !PARTS.contains(&p.as_str())) {
                        bail!("--only: unknown part {p:?} (known: {})", PARTS.join(","));
                    }
                }
                "--handovers" => o.handovers = num(value()?)?,
                "--queue" => o.queue = num(value()?)?,
                "--waiters" => {
                    o.waiters = value()?
                        .split(',')
                        .map(|s| num(&s.to_string()))
                        .collect::<Result<_>>()?
                }
                "--grants" => o.grants = num(value()?)?,
                "--arrivals" => o.arrivals = num(value()?)?,
                "--keys" => o.keys = num(value()?)?,
                "--runs-per-key" => o.runs_per_key = num(value()?)?,
                "--multi-key-waiters" => o.multi_key_waiters = num(value()?)?,
                "--history" => o.history = num(value()?)?,
                "--free-keys" => o.free_keys = num(value()?)?,
                "--free-keys-linger-s" => {
                    o.free_keys_linger = Duration::from_secs(num(value()?)? as u64)
                }
                "--kills" => o.kills = num(value()?)?,
                "--settle-ms" => o.settle = Duration::from_millis(num(value()?)? as u64),
                "--out" => o.out = PathBuf::from(value()?),
                other => bail!("unknown argument {other:?} (see benches/mutex/main.rs)"),
            }
        }
        if o.handovers < 2 || o.queue < 2 || o.runs_per_key < 2 || o.grants < 1 {
            bail!("--handovers, --queue and --runs-per-key need at least 2, --grants at least 1");
        }
        Ok(o)
    }

    pub fn runs(&self, part: &str) -> bool {
        self.parts.iter().any(|p| p == part)
    }
}

/// What every part needs: a client, the options, the table and the JSON being built.
pub struct Bench {
    pub client: Client,
    pub opts: Opts,
    pub table: Table,
    pub json: serde_json::Map<String, Value>,
}

impl Bench {
    /// Starts the release-built controller scoped to `ns` (info logs only) and waits until it
    /// grants a probe run, so that what follows measures a serving controller.
    pub async fn controller(&self, ns: &support::TestNamespace) -> Result<ControllerProcess> {
        let c = ControllerProcess::start_with(ns.name(), &[], &[("RUST_LOG", "info,kube=warn")])
            .await?;
        let api = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
        let probe = "bench-probe";
        create_all(&api, vec![objects::standalone_run(probe, "bench-probe")], 1).await?;
        support::pipelines::wait_reason(ns, probe, "Acquired", support::secs(120))
            .await
            .with_context(|| format!("the controller did not start; see {}", c.log.display()))?;
        api.delete(probe, &Default::default()).await?;
        Ok(c)
    }
}

/// No new grant for this long means the handover has stalled (figures then say how many keys
/// were not handed over, instead of failing the part).
pub const STALL: Duration = Duration::from_secs(60);

/// Waits until `count()` reaches `target` (runs seen Acquired), or until none has been for [`STALL`];
/// returns whether it stalled.
pub async fn wait_or_stall(count: impl Fn() -> usize, target: usize, timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    let (mut last, mut since) = (0, std::time::Instant::now());
    loop {
        let n = count();
        if n >= target {
            return false;
        }
        if n != last {
            (last, since) = (n, std::time::Instant::now());
        }
        if since.elapsed() >= STALL || std::time::Instant::now() >= deadline {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // poll of our own record, bounded
    }
}

/// Creates objects, `concurrency` at a time.
pub async fn create_all(
    api: &Api<DynamicObject>,
    objs: Vec<Value>,
    concurrency: usize,
) -> Result<()> {
    futures::stream::iter(objs)
        .map(|o| async move {
            let obj: DynamicObject = serde_json::from_value(o)?;
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating {}", obj.metadata.name.unwrap_or_default()))?;
            anyhow::Ok(())
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Merge-patches the status subresource of named objects, `concurrency` at a time.
pub async fn patch_status_all(
    api: &Api<DynamicObject>,
    patches: Vec<(String, Value)>,
    concurrency: usize,
) -> Result<()> {
    futures::stream::iter(patches)
        .map(|(name, p)| async move {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&p))
                .await
                .with_context(|| format!("patching the status of {name}"))?;
            anyhow::Ok(())
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Deletes named objects, `concurrency` at a time.
pub async fn delete_all(
    api: &Api<DynamicObject>,
    names: Vec<String>,
    concurrency: usize,
) -> Result<()> {
    futures::stream::iter(names)
        .map(|n| async move {
            api.delete(&n, &Default::default())
                .await
                .with_context(|| format!("deleting {n}"))?;
            anyhow::Ok(())
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// (VmHWM MiB, VmRSS MiB, CPU seconds) of a process.
pub fn usage(pid: u32) -> Result<(f64, f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("the controller (pid {pid}) is gone"))?;
    let kib = |field: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .unwrap_or("")
        .split(' ')
        .collect();
    let ticks: f64 = rest.get(11).and_then(|u| u.parse().ok()).unwrap_or(0.0)
        + rest
            .get(12)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0);
    Ok((kib("VmHWM:") / 1024.0, kib("VmRSS:") / 1024.0, ticks / hz))
}

fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(support::repo_root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "mem_gib": report::round(mem_kib as f64 / 1048576.0),
        "loadavg": read("/proc/loadavg").trim(),
        "commit": commit,
    })
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args).await {
        eprintln!("bench: error: {e:#}");
        std::process::exit(1);
    }
}

pub async fn run(args: &[String]) -> Result<()> {
    let opts = Opts::parse(args)?;
    let started = jiff::Timestamp::now();
    let mut bench = Bench {
        client: support::client().await?,
        opts: opts.clone(),
        table: Table::default(),
        json: serde_json::Map::new(),
    };
    let machine_before = machine();
    eprintln!("bench: machine {machine_before}");
    bench
        .json
        .insert("started".into(), json!(started.to_string()));
    bench
        .json
        .insert("options".into(), json!(format!("{opts:?}")));
    let mut failures = Vec::new();
    for part in PARTS.iter().filter(|p| opts.runs(p)) {
        eprintln!("bench: part {part} (load {})", machine()["loadavg"]);
        let result = match *part {
            "handover" => handover::run(&mut bench).await,
            "lease" => lease::run(&mut bench).await,
            "writes" => writes::run(&mut bench).await,
            "throughput" => throughput::run(&mut bench).await,
            "burst" => burst::run(&mut bench).await,
            "memory" => memory::run(&mut bench).await,
            "free-keys" => free_keys::run(&mut bench).await,
            "failover" => failover::run(&mut bench).await,
            _ => unreachable!("parts are checked when parsing"),
        };
        if let Err(e) = result {
            eprintln!("bench: part {part} failed: {e:#}");
            bench.table.section(&format!("{part}: FAILED: {e:#}"));
            failures.push(part.to_string());
        }
    }
    bench.json.insert("machine_before".into(), machine_before);
    bench.json.insert("machine_after".into(), machine());
    bench.json.insert("failed_parts".into(), json!(failures));
    bench.table.print();
    std::fs::create_dir_all(&opts.out)?;
    let file = opts
        .out
        .join(format!("bench-{}.json", started.strftime("%Y%m%dT%H%M%SZ")));
    let text = serde_json::to_string_pretty(&Value::Object(bench.json))?;
    std::fs::write(&file, &text)?;
    std::fs::write(opts.out.join("latest.json"), &text)?;
    println!("\nJSON: {}", file.display());
    if !failures.is_empty() {
        bail!("parts failed: {}", failures.join(", "));
    }
    Ok(())
}
