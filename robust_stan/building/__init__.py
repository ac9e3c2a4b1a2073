"""Building a model: families, divergences, the program spec, the user data made Stan data, the generated Stan code."""
