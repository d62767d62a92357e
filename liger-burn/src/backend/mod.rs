//! placeholder: being written
pub struct Liger;
