from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.template import PromptTemplate
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment, tokenize_prompt

__all__ = [
    "PromptTemplate",
    "Segment",
    "SegmentKind",
    "SegmentedPrompt",
    "TokenizedPrompt",
    "TokenizedSegment",
    "tokenize_prompt",
]
