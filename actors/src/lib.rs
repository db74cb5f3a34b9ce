//! plegd's actors and the runtime boundary. See DESIGN.md for the picture.

pub mod runtime;
