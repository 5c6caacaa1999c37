/*
 * ust_config_doc: writes docs/configuration.md from the config parser's
 * field table (plugin/config.c), so that the page says what the parser
 * accepts and nothing else:
 *
 *     ust_config_doc [OUT]        (default: standard output)
 *
 * `cmake --build build --target config_doc` runs it on the page;
 * tests/python/test_config_doc.py fails when the committed page differs
 * from what it writes. The examples on the page are parsed before they are
 * written: one the parser refuses fails the program.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/plugin.h"

static const char *const regenerate = "cmake --build build --target config_doc";

static const char *const intro =
    "understudy reads one JSON config when it is enabled. The parser is strict: a field it does not know, a\n"
    "value of the wrong type or outside its range is refused with a message that names the field's JSON path\n"
    "(`config: 'operators.gemm.sample' must be a number in [0, 1]`), and nothing is intercepted.\n"
    "\n"
    "How a config is given:\n"
    "\n"
    "- **Python**: `understudy.enable(config)`, where `config` is a dict, a JSON string or the path of a JSON\n"
    "  file; without one, `$UNDERSTUDY_CONFIG`, else the defaults (every shipped operator observed, no report\n"
    "  file). A refused config raises `understudy.ConfigError`.\n"
    "- **Without code changes**: with the package installed by pip, `UNDERSTUDY_CONFIG` (a path or inline JSON)\n"
    "  enables understudy in every Python process of a command once it imports torch, and in vLLM's and\n"
    "  SGLang's processes through their plugin loaders. `understudy run [--config CONFIG] -- CMD` sets it for\n"
    "  one command (by default: observe every operator, write `understudy-report-{pid}.json`).\n"
    "- **C**: `ust_enable(config_json, problems_dir)`; a refused config returns `UST_ECONFIG` and\n"
    "  `ust_last_error()` says why.\n"
    "- **While running**: `understudy.reload(config)` (C: `ust_reload`) applies the fields marked *reload* below.\n"
    "  A config that differs in any other field is refused, naming it, and nothing is applied.\n"
    "\n"
    "`report.path` and `state.path` may hold `{pid}`, `{rank}` and `{local_rank}`, replaced in each process so\n"
    "that processes sharing one config keep files of their own: the rank is the first of `RANK`,\n"
    "`OMPI_COMM_WORLD_RANK`, `PMI_RANK` and `SLURM_PROCID` set, the local rank the first of `LOCAL_RANK`,\n"
    "`OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID` and `SLURM_LOCALID`; `{{` and `}}` write braces.\n"
    "\n"
    "Below, `<name>` stands for an operator's name (its definition, `problems/<name>.json`) and `<key>` for a\n"
    "shape key as the report spells it; a *map* is an object whose keys you choose.\n";

/* The smallest useful config, and one that shadows a candidate: both parsed
 * before they are written. */
static const char *const example_minimal = "{\"report\": {\"path\": \"understudy-report-{pid}.json\"}}";

static const char *const example_shadow =
    "{\n"
    "  \"report\": {\"path\": \"understudy-report-{rank}.json\", \"interval_s\": 30},\n"
    "  \"state\": {\"path\": \"understudy-state-{rank}.json\"},\n"
    "  \"defaults\": {\"mode\": \"off\"},\n"
    "  \"operators\": {\n"
    "    \"gemm\": \"observe\",\n"
    "    \"rms_norm\": {\n"
    "      \"mode\": \"shadow\",\n"
    "      \"sample\": 0.25,\n"
    "      \"candidate\": {\n"
    "        \"native\": \"/opt/kernels/librms_norm.so\",\n"
    "        \"sha256\": \"9f2c1e5d7a0b4c3e8f6a1d2b5c7e9f0a3b4c6d8e1f2a5b7c9d0e3f4a6b8c1d2e\",\n"
    "        \"target\": \"_C::rms_norm\"\n"
    "      },\n"
    "      \"guard\": {\"atol\": 0.01, \"rtol\": 0.05},\n"
    "      \"promotion\": {\"min_verified\": 200}\n"
    "    }\n"
    "  }\n"
    "}";

/* Fails the program unless the parser accepts both examples (their {rank}
 * read as 0, whatever this process's environment says). */
static void examples_check(void) {
  const char *const examples[] = {example_minimal, example_shadow};
  setenv("RANK", "0", 1);
  for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
    ust__config c;
    if (ust__config_parse(examples[i], &c) != 0) {
      fprintf(stderr, "ust_config_doc: the parser refuses example %zu: %s\n", i + 1, ust_last_error());
      exit(1);
    }
    ust__config_free(&c);
  }
}

static const ust__config_field *table;
static int table_n;

/* A field's full path ("operators.<name>.guard.atol"). */
static void full_path(const ust__config_field *f, char *out, size_t cap) {
  snprintf(out, cap, "%s%s%s", f->section, *f->section ? "." : "", f->name);
}

/* GitHub's anchor for a heading: lower case, letters, digits, '-' and '_'
 * kept, spaces to '-', the rest dropped. */
static void anchor(const char *heading, char *out, size_t cap) {
  size_t n = 0;
  for (const char *p = heading; *p != '\0' && n + 1 < cap; p++)
    if (isalnum((unsigned char)*p) || *p == '-' || *p == '_')
      out[n++] = (char)tolower((unsigned char)*p);
    else if (*p == ' ')
      out[n++] = '-';
  out[n] = '\0';
}

/* text into a table cell: '|' escaped. */
/* A table cell: '|' escaped; a whole number of 7 digits or more grouped by
 * thousands (1,000,000), as a reader writes it and no commit id looks. */
static void cell(FILE *out, const char *text) {
  for (const char *p = text; *p != '\0'; p++) {
    if (*p == '|')
      fputc('\\', out);
    size_t run = 0;
    while (p[run] >= '0' && p[run] <= '9')
      run++;
    const int whole = run >= 7 && (p == text || (p[-1] != '.' && !(p[-1] >= '0' && p[-1] <= '9')));
    if (whole) {
      for (size_t i = 0; i < run; i++) {
        fputc(p[i], out);
        if ((run - 1 - i) % 3 == 0 && i + 1 < run)
          fputc(',', out);
      }
      p += run - 1;
      continue;
    }
    fputc(*p, out);
  }
}

static const char *type_word(const ust__config_field *f) {
  switch (f->type) {
  case UST__FIELD_INTEGER:
  case UST__FIELD_COUNT:
    return "integer";
  case UST__FIELD_NUMBER:
    return "number";
  case UST__FIELD_BOOL:
    return "boolean";
  case UST__FIELD_STRING:
  case UST__FIELD_CHOICE:
    return "string";
  case UST__FIELD_PATH:
    return "path";
  case UST__FIELD_MODE:
    return "mode";
  case UST__FIELD_MAP:
    return "map";
  case UST__FIELD_MODE_OR_OBJECT:
    return "mode or object";
  default:
    return "object";
  }
}

/* The entry whose own path is path, or NULL. */
static const ust__config_field *entry_at(const char *path) {
  char p[256];
  for (int i = 0; i < table_n; i++) {
    full_path(&table[i], p, sizeof p);
    if (strcmp(p, path) == 0)
      return &table[i];
  }
  return NULL;
}

/* The placeholder entry a map holds ("<name>"), or NULL. */
static const ust__config_field *map_values(const ust__config_field *map) {
  char p[256];
  full_path(map, p, sizeof p);
  for (int i = 0; i < table_n; i++)
    if (strcmp(table[i].section, p) == 0 && table[i].name[0] == '<')
      return &table[i];
  return NULL;
}

/* The section a field's value is documented in, into sec ("" when none). */
static void section_of(const ust__config_field *f, char *sec, size_t cap) {
  sec[0] = '\0';
  if (f->type == UST__FIELD_OBJECT || f->type == UST__FIELD_MODE_OR_OBJECT) {
    full_path(f, sec, cap);
  } else if (f->type == UST__FIELD_MAP) {
    const ust__config_field *v = map_values(f);
    if (v != NULL)
      full_path(v, sec, cap);
  }
}

static void heading_of(const char *sec, char *out, size_t cap) {
  if (sec[0] == '\0')
    snprintf(out, cap, "The top level");
  else
    snprintf(out, cap, "`%s`", sec);
}

static void accepts(FILE *out, const ust__config_field *f) {
  char text[256], sec[256], head[300], id[300];
  switch (f->type) {
  case UST__FIELD_CHOICE:
    for (int i = 0; f->choices[i] != NULL; i++)
      fprintf(out, "%s`%s`", i ? ", " : "", f->choices[i]);
    return;
  case UST__FIELD_MODE:
    fputs("`off`, `observe`, `shadow`, `canary`, `live`", out);
    return;
  case UST__FIELD_BOOL:
    fputs("`true`, `false`", out);
    return;
  case UST__FIELD_PATH:
    fputs("a path; `{pid}`, `{rank}`, `{local_rank}` replaced", out);
    return;
  case UST__FIELD_OBJECT:
  case UST__FIELD_MAP:
  case UST__FIELD_MODE_OR_OBJECT:
    section_of(f, sec, sizeof sec);
    if (sec[0] == '\0') {
      fputs(f->type == UST__FIELD_MAP ? "see the description" : "—", out);
      return;
    }
    heading_of(sec, head, sizeof head);
    anchor(head, id, sizeof id);
    fprintf(out, "see [`%s`](#%s)", sec, id);
    return;
  default:
    ust__config_field_expects(f, text, sizeof text);
    cell(out, text);
  }
}

static void row(FILE *out, const ust__config_field *f) {
  fprintf(out, "| `%s`%s | %s | ", f->name, (f->flags & UST__FIELD_RELOADABLE) ? " *reload*" : "", type_word(f));
  if (f->def != NULL) {
    fputc('`', out);
    cell(out, f->def);
    fputc('`', out);
  } else {
    cell(out, f->def_words != NULL ? f->def_words : "—");
  }
  fputs(" | ", out);
  accepts(out, f);
  fputs(" | ", out);
  cell(out, f->doc);
  fputs(" |\n", out);
}

/* Section sec: its heading, what it is, its fields; then the sections its
 * fields open, in the table's order. */
static void section(FILE *out, const char *sec) {
  char head[300], sub[256];
  heading_of(sec, head, sizeof head);
  fprintf(out, "\n## %s\n\n", head);
  const ust__config_field *self = entry_at(sec);
  if (self != NULL && self->name[0] == '<') {
    /* the values of a map: what the map is, then what each value is */
    const ust__config_field *map = entry_at(self->section);
    if (map != NULL)
      fprintf(out, "%s ", map->doc);
  }
  if (self != NULL)
    fprintf(out, "%s\n\n", self->doc);
  else
    fputs("The fields of the config's top-level object.\n\n", out);
  fputs("| field | type | default | accepts | what it does |\n| --- | --- | --- | --- | --- |\n", out);
  for (int i = 0; i < table_n; i++)
    if (strcmp(table[i].section, sec) == 0)
      row(out, &table[i]);
  for (int i = 0; i < table_n; i++)
    if (strcmp(table[i].section, sec) == 0) {
      section_of(&table[i], sub, sizeof sub);
      if (sub[0] != '\0')
        section(out, sub);
    }
}

int main(int argc, char **argv) {
  if (argc > 2) {
    fprintf(stderr, "usage: ust_config_doc [OUT]\n");
    return 2;
  }
  examples_check();
  table = ust__config_fields(&table_n);
  FILE *out = argc == 2 ? fopen(argv[1], "w") : stdout;
  if (out == NULL) {
    perror(argv[1]);
    return 1;
  }
  fprintf(out,
          "<!-- Generated from the config parser's field table (plugin/config.c) by plugin/config_doc.c: do not "
          "edit.\n     Regenerate: %s -->\n",
          regenerate);
  fprintf(out, "# Configuration\n\n%s", intro);
  fprintf(out, "\nThe smallest useful config observes every operator and writes a report:\n\n```json\n%s\n```\n",
          example_minimal);
  fprintf(out,
          "\nOne that observes `gemm`, shadows a native candidate for `rms_norm` (its `sha256` is the file's:\n"
          "`sha256sum`, or `understudy.native(path)` in Python, which writes the whole entry) and lets the\n"
          "promotion policy move it to canary and live, with one report and state file per rank:\n\n"
          "```json\n%s\n```\n",
          example_shadow);
  section(out, "");
  if (fflush(out) != 0 || ferror(out) || (out != stdout && fclose(out) != 0)) {
    perror(argc == 2 ? argv[1] : "stdout");
    return 1;
  }
  return 0;
}
