//! Mixture-of-experts dispatch and combine (DeepEP-style) on symmetric memory.
