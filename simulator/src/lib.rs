//! A payment provider simulator with fault injection: the ground truth for tests
