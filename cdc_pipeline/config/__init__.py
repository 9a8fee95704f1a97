"""The config table: one typed, validated row per source table (no Spark, no Airflow).

- `model.py`: `TableConfig`, its fields grouped by role (the YAML row stays flat);
- `types.py`: the validated field types, `Duration` and `Schedule` carrying their values;
- `rules.py`: the cross-field rules, each declaring the fields it reads;
- `one_pass.py`: how a row's field problems and broken rules come out of one validation;
- `messages.py`: pydantic's errors in the project's words;
- `formats.py`: the change formats' `_cdc_` columns and implied defaults;
- `document.py`: the YAML document with its lines, repeated keys and alias limits;
- `loader.py`: the file read into valid rows and `file:line` problems.
"""

from cdc_pipeline.config.formats import DEFAULT_SEQUENCE_BY as DEFAULT_SEQUENCE_BY
from cdc_pipeline.config.formats import EVENT_FORMATS as EVENT_FORMATS
from cdc_pipeline.config.formats import with_format_defaults as with_format_defaults
from cdc_pipeline.config.loader import ConfigLoadResult as ConfigLoadResult
from cdc_pipeline.config.loader import ConfigProblem as ConfigProblem
from cdc_pipeline.config.loader import load_table_configs as load_table_configs
from cdc_pipeline.config.loader import parse_config as parse_config
from cdc_pipeline.config.messages import COLUMN_PATTERN as COLUMN_PATTERN
from cdc_pipeline.config.messages import NAME_PATTERN as NAME_PATTERN
from cdc_pipeline.config.model import TableConfig as TableConfig
from cdc_pipeline.config.rules import VACUUM_SAFE_HOURS as VACUUM_SAFE_HOURS
from cdc_pipeline.config.types import ColumnList as ColumnList
from cdc_pipeline.config.types import ColumnTypes as ColumnTypes
from cdc_pipeline.config.types import Duration as Duration
from cdc_pipeline.config.types import Schedule as Schedule
from cdc_pipeline.paths import default_config_path as default_config_path
from cdc_pipeline.paths import project_root as project_root
