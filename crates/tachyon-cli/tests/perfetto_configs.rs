//! `tachyon record -c` with configs written the way Perfetto's own are (its `test/configs/`):
//! every field of Perfetto's TraceConfig schema parses; a data source no producer offers is
//! named in a warning and records nothing; the rest records as asked.

mod common;

use std::process::Command;

use common::{clean_command, int, tmp_dir};
use tachyon_processor::{Options, TraceProcessor};

/// Fields of data sources Tachyon has no producer for (kernel tracing, the heap profiler, GPU
/// counters, Android logs), session-level fields it does not act on (triggers, producers,
/// statsd, guardrails), and the data sources it does run: all in one config.
const CONFIG: &str = r#"
# Our own config; the fields are those Perfetto's test/configs use.
duration_ms: 10000
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
buffers { size_kb: 2048 fill_policy: DISCARD }
enable_extra_guardrails: false
producers { producer_name: "perfetto.traced_probes" shm_size_kb: 4096 page_size_kb: 4 }
trigger_config {
  trigger_mode: STOP_TRACING
  trigger_timeout_ms: 60000
  triggers { name: "my_trigger" stop_delay_ms: 100 producer_name_regex: ".*" }
}
data_sources {
  config {
    name: "linux.ftrace"
    target_buffer: 0
    ftrace_config {
      buffer_size_kb: 2048
      drain_period_ms: 250
      ftrace_events: "sched/sched_switch"
      ftrace_events: "power/cpu_frequency"
      atrace_categories: "gfx"
      atrace_apps: "*"
      compact_sched { enabled: true }
      symbolize_ksyms: true
    }
  }
}
data_sources {
  config {
    name: "android.heapprofd"
    heapprofd_config {
      sampling_interval_bytes: 4096
      process_cmdline: "my_app"
      shmem_size_bytes: 8388608
      continuous_dump_config { dump_phase_ms: 0 dump_interval_ms: 1000 }
    }
  }
}
data_sources {
  config {
    name: "linux.perf"
    perf_event_config {
      timebase { frequency: 100 counter: SW_CPU_CLOCK }
      callstack_sampling { kernel_frames: true }
      all_cpus: true
      sampling_frequency: 100
    }
  }
}
data_sources {
  config {
    name: "gpu.counters"
    gpu_counter_config { counter_period_ns: 1000000 counter_ids: 3 counter_ids: 1 }
  }
}
data_sources {
  config {
    name: "android.log"
    android_log_config { log_ids: LID_DEFAULT log_ids: LID_SYSTEM min_prio: PRIO_INFO }
  }
}
data_sources {
  config {
    name: "linux.sys_stats"
    target_buffer: 1
    sys_stats_config {
      meminfo_period_ms: 50
      meminfo_counters: MEMINFO_MEM_AVAILABLE
      meminfo_counters: MEMINFO_CACHED
      stat_period_ms: 50
      stat_counters: STAT_CPU_TIMES
    }
  }
}
data_sources {
  config {
    name: "linux.process_stats"
    target_buffer: 0
    process_stats_config { scan_all_processes_on_start: true proc_stats_poll_ms: 100 }
  }
}
"#;

#[test]
fn perfetto_style_configs_record_what_tachyon_offers_and_name_the_rest() {
    let dir = tmp_dir("perfetto-configs");
    let cfg = dir.join("full.cfg");
    std::fs::write(&cfg, CONFIG).unwrap();
    let out = dir.join("t.pftrace");
    let output = clean_command(env!("CARGO_BIN_EXE_tachyon"))
        // No daemon there: `record` runs an embedded one for the program.
        .arg("record")
        .arg("--consumer-socket")
        .arg(dir.join("none.sock"))
        .arg("-c")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .args(["--", "sleep", "0.4"])
        .output()
        .expect("run tachyon record");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for ds in [
        "linux.ftrace",
        "android.heapprofd",
        "gpu.counters",
        "android.log",
    ] {
        assert!(
            stderr.contains(&format!(
                "data source \"{ds}\": no Tachyon producer offers it"
            )),
            "{ds} not named:\n{stderr}"
        );
    }
    for ds in ["linux.sys_stats", "linux.process_stats", "linux.perf"] {
        assert!(
            !stderr.contains(&format!("data source \"{ds}\"")),
            "{stderr}"
        );
    }
    // Fields Tachyon does not act on are named with their lines.
    assert!(
        stderr.contains("full.cfg:9: trigger_config.trigger_mode"),
        "{stderr}"
    );
    assert!(
        stderr.contains("data_sources.config.ftrace_config.ftrace_events"),
        "{stderr}"
    );

    // What Tachyon offers recorded as asked: the chosen meminfo counters and CPU times.
    let tp = TraceProcessor::from_bytes(&std::fs::read(&out).unwrap(), &Options::default())
        .expect("read the trace");
    assert!(
        int(
            &tp,
            "SELECT count(*) FROM counter c JOIN counter_track t ON c.track_id = t.id \
             WHERE t.name = 'MemAvailable'"
        ) >= 2
    );
    assert_eq!(
        int(
            &tp,
            "SELECT count(*) FROM counter_track WHERE name = 'MemFree'"
        ),
        0,
        "only the counters the config names"
    );
    assert!(int(&tp, "SELECT count(*) FROM process") > 1);
}

#[test]
fn a_misspelt_field_is_still_an_error() {
    let dir = tmp_dir("perfetto-configs-bad");
    let cfg = dir.join("bad.cfg");
    std::fs::write(
        &cfg,
        "data_sources { config { name: \"linux.ftrace\" ftrace_config { ftrace_event: \"x\" } } }\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tachyon"))
        .arg("record")
        .arg("-c")
        .arg(&cfg)
        .arg("-o")
        .arg(dir.join("t.pftrace"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.cfg:1:") && stderr.contains("ftrace_event"),
        "{stderr}"
    );
}
