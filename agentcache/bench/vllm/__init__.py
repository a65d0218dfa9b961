"""The vLLM bench (`agentcache bench --backend vllm`): configurations run in their own processes."""
