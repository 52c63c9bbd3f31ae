//! Small programs that show the pmd API: see `src/bin/` (`cargo run -p examples --bin loopback`).
