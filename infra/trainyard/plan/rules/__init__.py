"""The rehearsal's readiness rules, one module per subject; `registry.RULES` lists them."""
