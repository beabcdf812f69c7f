"""The virtual-time simulator: the broker's control plane (tracker, claim policy, scaler,
budgets, standby gate, hold breaking, one dispatcher pass) driven by a discrete-event loop over
venue models and the paper's workloads. See docs/simulator.md."""
