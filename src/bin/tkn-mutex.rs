//! `tkn-mutex`: see and control the queues of tekton-mutex keys. On PATH it is
//! also `tkn mutex ...` (tkn runs `tkn-<name>` plugins from PATH).

#[tokio::main]
async fn main() {
    std::process::exit(tekton_mutex::cli::main().await);
}
