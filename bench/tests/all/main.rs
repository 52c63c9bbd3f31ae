//! The bench tools' tests, in one binary: their command lines (`cli`) and the datapath
//! harness over every path (`datapath_harness`).

mod cli;
mod datapath_harness;
