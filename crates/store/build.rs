// `sqlx::migrate!` embeds the migrations at compile time; without this a
// migration added to an already-built tree is silently left out.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
