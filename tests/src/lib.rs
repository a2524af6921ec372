//! The cross-process suite: real binaries, a throwaway PostgreSQL, the simulator
