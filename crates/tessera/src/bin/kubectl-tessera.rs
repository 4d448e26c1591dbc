//! `kubectl-tessera`: the kubectl plugin (`kubectl tessera top|pods|explain`).
//! kubectl runs any `kubectl-NAME` executable on `PATH` as `kubectl NAME`.

fn main() -> std::process::ExitCode {
    tessera::cmd::kubectl::main()
}
