"""The leaves every room stands on: typed errors with stable codes, states, the config schema
layer, atomic files and credentials. Imports nothing else of edged."""
