//! The examples' tests, in one binary: each program runs and refuses bad arguments (`run`),
//! and the ones that talk to the Linux kernel do so through network namespaces (`netns`).

mod netns;
mod run;
