//! Settings read from the environment, one way for every variable of this crate.

use crate::error::KernelError;

/// What `var` holds, trimmed: `None` when it is unset or empty (the default applies). A
/// value that is not UTF-8 comes back converted lossily, for the caller's parser to
/// refuse by name.
pub(crate) fn setting(var: &str) -> Option<String> {
    let value = match std::env::var(var) {
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => return None,
        Err(std::env::VarError::NotUnicode(v)) => v.to_string_lossy().into_owned(),
    };
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

/// The choice `var` names (`parse`), the default when it is unset or empty, or
/// [`KernelError::BadEnv`] naming the variable and what it may hold (`expected`).
pub(crate) fn choice<T: Default>(
    var: &'static str,
    parse: fn(&str) -> Option<T>,
    expected: &'static str,
) -> Result<T, KernelError> {
    match setting(var) {
        None => Ok(T::default()),
        Some(value) => parse(&value).ok_or(KernelError::BadEnv {
            var,
            value,
            expected,
        }),
    }
}
