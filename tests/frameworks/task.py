"""The tool task every framework's loop runs: look up a city's temperature, convert it to
Fahrenheit, answer. Two tools with typed arguments and deterministic results, so a loop's
transcript depends only on what the model says."""

from __future__ import annotations

INSTRUCTIONS = (
    "You are Meteo, a weather assistant. Use the tools: first get_temperature for the city the "
    "user names, then to_fahrenheit on the temperature it returns, then answer in one short "
    "sentence with both numbers. Never guess a temperature; only the tools know it. "
    "Cities you serve: Paris, Lyon, Oslo, Lima, Perth, Quito and Hanoi."
)
QUESTION = "How warm is it in Oslo right now, in Fahrenheit?"
FOLLOW_UP = "And in Lima?"
# Small, so each step is short, yet enough for the 135M model to close a forced call's JSON: it
# tends to write the tool's schema as the arguments, and a call cut off comes back as text
# (finish_reason "length"; the Agents SDK raises on it, LangGraph ends the loop there).
MAX_TOKENS = 96
TEMPERATURES = {"paris": 18.0, "lyon": 21.0, "oslo": 7.0, "lima": 24.0, "perth": 30.0}


def get_temperature(city: str) -> str:
    """Get the current temperature of a city in degrees Celsius.

    Args:
        city: the city's name, e.g. Paris
    """
    c = TEMPERATURES.get(city.strip().lower())
    return f"unknown city {city!r}" if c is None else f"{city}: {c:.0f} C"


def to_fahrenheit(celsius: float) -> str:
    """Convert a temperature from degrees Celsius to degrees Fahrenheit.

    Args:
        celsius: the temperature in degrees Celsius
    """
    return f"{celsius * 9 / 5 + 32:.1f} F"


TOOL_NAMES = ("get_temperature", "to_fahrenheit")
