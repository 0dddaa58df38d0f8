"""The leaves every room stands on: typed errors with stable codes, states, the config schema
layer, atomic files, credentials and the numbers in a remote's text. Imports nothing else of
edged."""
