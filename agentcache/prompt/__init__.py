from agentcache.prompt.registry import TEMPLATES, TemplateRegistry, TemplateSource, load_template
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.template import PromptTemplate
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment, tokenize_prompt

__all__ = [
    "TEMPLATES",
    "PromptTemplate",
    "Segment",
    "SegmentKind",
    "SegmentedPrompt",
    "TemplateRegistry",
    "TemplateSource",
    "TokenizedPrompt",
    "TokenizedSegment",
    "load_template",
    "tokenize_prompt",
]
