"""trainyard's guardrails as plain functions over resource views, so they run with or without the Pulumi engine."""
