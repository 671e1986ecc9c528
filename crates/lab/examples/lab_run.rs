//! Runs a scenario in bridge and victim-alone modes until the CLI wires `picnic lab run`:
//! `cargo run -p picnic-lab --release --example lab_run -- FILE [OUT_DIR]` (as root).

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: lab_run SCENARIO.toml [OUT_DIR]");
        std::process::exit(2);
    };
    let opts = picnic_lab::RunOptions {
        out: args.next().map(Into::into),
        ..Default::default()
    };
    let result = picnic_lab::run_scenario(path.as_ref(), &opts);
    if let Err(e) = &result {
        eprintln!("picnic lab: {e:#}");
    }
    std::process::exit(picnic_lab::exit_code(&result));
}
