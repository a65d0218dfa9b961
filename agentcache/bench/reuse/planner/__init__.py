"""The plan predictor's data, fit, calibration and reports, from bench runs."""
