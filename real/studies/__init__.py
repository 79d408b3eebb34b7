"""Measurements of a real model that feed the simulator's inputs: quantization quality
(`quant_quality`), SelectInfer's selection quality (`selectinfer_quality`), block importance and
pruning (`gsi`, `pruning`), the low-rank predictor's training (`predictor_train`) and how its errors
persist from token to token (`predictor_errors`, `predictor_error_stats`).
"""
