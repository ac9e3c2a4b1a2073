"""The public entry points: Model and the model constructors, rs.rob_ula, rs.tune_rob_ula, rs.influence.

Arguments are checked and converted here, once per call."""
