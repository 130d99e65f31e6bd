//! Gives liblease.so a versioned SONAME on Linux (`liblease.so.MAJOR` from
//! 1.0 on; `liblease.so.0.MINOR` before, when every minor may break the ABI),
//! so programs linked against one ABI never load an incompatible one.
fn main() {
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        let major = env!("CARGO_PKG_VERSION_MAJOR");
        let minor = env!("CARGO_PKG_VERSION_MINOR");
        let soname = if major == "0" {
            format!("liblease.so.0.{minor}")
        } else {
            format!("liblease.so.{major}")
        };
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    }
    // The memory authority's embedded Lua (the mlua crate builds it as a
    // static library and links it without bundling it): bundled here, so
    // liblease.a carries it and a C program links liblease.a alone. The
    // library's directory comes from mlua-sys' link search path.
    println!("cargo:rustc-link-lib=static:+bundle=lua5.1");
    println!("cargo:rerun-if-changed=build.rs");
}
