//! Work the user sized by mistake is refused before it starts: a
//! comparison or simulation estimated over 2 h names `--long` (which runs
//! it anyway) and the flags that make it smaller; lists longer than any
//! real one (`--compare` sets, `--sweep` points) are refused outright;
//! `--long` where nothing long can run is refused as ignored. Each refusal
//! is quick, small and one line (exit 2).

use integration_tests::user_error::{sim_user_error, user_error};

#[test]
fn long_comparisons_name_long_and_what_to_lower() {
    let lower = ["would take about", "--long", "--reps", "--duration"];
    user_error(
        &[
            "sched-bench",
            "cyclic",
            "--compare",
            "seeds",
            "--reps",
            "100",
            "--duration",
            "1h",
        ],
        &lower,
    );
    user_error(
        &[
            "bench",
            "runq",
            "--compare",
            "none;all",
            "--reps",
            "50",
            "--duration",
            "10m",
        ],
        &lower,
    );
    // 2000 s of virtual time on 480 CPUs: hours of real time.
    user_error(
        &["sim", "messaging", "-t", "gnr-2s", "-d", "2000s"],
        &["would take about", "--long", "--duration"],
    );
    sim_user_error(
        &["messaging", "-t", "gnr-2s", "-d", "2000s"],
        &["would take about", "--long"],
    );
    // A sweep multiplies: 10 points x 2 sets x 10 seeds of 60 s.
    user_error(
        &[
            "sim",
            "messaging",
            "-t",
            "gnr-2s",
            "-d",
            "60s",
            "--compare",
            "none;all",
            "--reps",
            "10",
            "--sweep",
            "cpus=16,32,64,96,128,192,256,320,384,480",
        ],
        &["would take about", "--sweep"],
    );
}

#[test]
fn lists_longer_than_any_real_one_are_refused() {
    let sets = "all;".repeat(500);
    for cmd in [["bench", "cyclic"], ["sched-bench", "cyclic"]] {
        let mut a = cmd.to_vec();
        a.extend(["--compare", &sets]);
        user_error(&a, &["--compare", "500 sets", "at most 64"]);
    }
    user_error(
        &["sim", "cyclic", "-t", "gnr-2s", "--compare", &sets],
        &["--compare", "500 sets", "at most 64"],
    );
    let points: Vec<String> = (2..2002).map(|n| n.to_string()).collect();
    let sweep = format!("cpus={}", points.join(","));
    user_error(
        &["sim", "cyclic", "-t", "gnr-2s", "--sweep", &sweep],
        &["--sweep", "2000 points", "at most 64"],
    );
}

#[test]
fn long_where_nothing_long_runs_is_refused() {
    user_error(
        &["bench", "runq", "--long"],
        &["--long", "applies to a comparison only"],
    );
    user_error(
        &["sched-bench", "cyclic", "--long"],
        &["--long", "applies to --compare only"],
    );
}
