//! Collectives on teams (barrier, broadcast, reductions, all-gather, all-to-all), backend-independent.
