//! The `tandem` binary: server, sandbox, certificates and client commands.

fn main() -> std::process::ExitCode {
    tandem::cli::main()
}
