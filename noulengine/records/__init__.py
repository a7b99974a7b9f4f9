"""Canonical records: parsing, validation and JSONL loading."""

from noulengine.records.errors import (NoulEngineError, OverlengthError, RecordError, TokenizerError,
                                       UnsupportedModalityError)
from noulengine.records.loader import LoadResult, load_records, parse_json_line
from noulengine.records.schema import (Image, Question, Record, Request, Target, canonical_json, parse_question,
                                       parse_questions, parse_record, request_from_json)

__all__ = ["Image", "LoadResult", "NoulEngineError", "OverlengthError", "Question", "Record", "RecordError", "Request",
           "Target", "TokenizerError", "UnsupportedModalityError", "canonical_json", "load_records",
           "parse_json_line", "parse_question", "parse_questions", "parse_record", "request_from_json"]
