//! jet-backend
