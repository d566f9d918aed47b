//! Two models that are not GPT, written against zero-core's `Model` trait and the device
//! ops of zero-kernels, shared by the examples and zero-core's tests.

#![allow(dead_code)]

pub mod char_lm;
pub mod data;
pub mod init;
pub mod launch;
pub mod mlp;
pub mod train;
