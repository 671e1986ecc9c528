//! The picnic dataplane (DESIGN.md section 4): packet buffers and port backends; the engines,
//! config and run loop build on them.

pub mod frame;
pub mod port;
