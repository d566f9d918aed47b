//! zero-models: the GPT-2 reference model and data loading.
#![deny(missing_docs)]
