"""polar_serve: a CPU reference inference server speaking the SGLang and vLLM token APIs."""
