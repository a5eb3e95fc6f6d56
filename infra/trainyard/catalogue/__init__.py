"""The add-on catalogue as data: chart pins, base values and add-on declarations read from platform/."""
