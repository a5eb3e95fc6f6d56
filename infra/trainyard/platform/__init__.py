"""Platform layer: one ComponentResource per cluster add-on, driven by the `platform/` catalogue."""
