/* The roofline expression evaluator: recursive descent to a postfix
 * program, evaluated on a small stack. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scorer/scorer.h"

#define MAX_TEXT 1024
#define MAX_STEPS 256
#define MAX_DEPTH 64
#define MAX_STACK 64

enum op {
  OP_NUM, OP_VAR, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MOD, OP_POW, OP_NEG,
  OP_MIN, OP_MAX, OP_CEIL, OP_FLOOR, OP_ABS, OP_CDIV,
};

typedef struct step {
  int op;
  int arg;   /* OP_VAR: index; OP_MIN/OP_MAX: argument count */
  double v;  /* OP_NUM */
} step;

struct ust__expr {
  char text[MAX_TEXT + 1];
  int n;
  step steps[MAX_STEPS];
};

typedef struct parser {
  const char *s;
  size_t at;
  int depth;
  const char *const *vars;
  int n_vars;
  ust__expr *e;
  int failed;
} parser;

static int fail(parser *p, const char *what) {
  if (!p->failed)
    ust__error(UST_EPROBLEM, "expression '%s': %s at position %zu", p->s, what, p->at);
  p->failed = 1;
  return -1;
}

static void skip_space(parser *p) {
  while (p->s[p->at] == ' ' || p->s[p->at] == '\t')
    p->at++;
}

static int emit(parser *p, int op, int arg, double v) {
  if (p->e->n >= MAX_STEPS)
    return fail(p, "too long (more than 256 steps)");
  p->e->steps[p->e->n++] = (step){op, arg, v};
  return 0;
}

static int parse_expr(parser *p);
static int parse_unary(parser *p);

static int parse_call(parser *p, const char *name, size_t len) {
  static const struct {
    const char *name;
    int op, min_args, max_args;
  } fns[] = {{"min", OP_MIN, 2, 16}, {"max", OP_MAX, 2, 16}, {"ceil", OP_CEIL, 1, 1},
             {"floor", OP_FLOOR, 1, 1}, {"abs", OP_ABS, 1, 1}, {"cdiv", OP_CDIV, 2, 2}};
  int fi = -1;
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    if (strlen(fns[i].name) == len && strncmp(fns[i].name, name, len) == 0)
      fi = (int)i;
  if (fi < 0)
    return fail(p, "unknown function (min, max, ceil, floor, abs, cdiv)");
  p->at++; /* ( */
  int n = 0;
  for (;;) {
    if (parse_expr(p) != 0)
      return -1;
    n++;
    skip_space(p);
    if (p->s[p->at] == ',') {
      p->at++;
      continue;
    }
    if (p->s[p->at] != ')')
      return fail(p, "expected ',' or ')'");
    p->at++;
    break;
  }
  if (n < fns[fi].min_args || n > fns[fi].max_args)
    return fail(p, "wrong number of arguments");
  return emit(p, fns[fi].op, n, 0);
}

static int parse_primary(parser *p) {
  skip_space(p);
  const char c = p->s[p->at];
  if (c == '(') {
    p->at++;
    if (parse_expr(p) != 0)
      return -1;
    skip_space(p);
    if (p->s[p->at] != ')')
      return fail(p, "expected ')'");
    p->at++;
    return 0;
  }
  if (isdigit((unsigned char)c) || c == '.') {
    char *end = NULL;
    double v = strtod(p->s + p->at, &end);
    if (end == p->s + p->at || !isfinite(v))
      return fail(p, "bad number");
    p->at = (size_t)(end - p->s);
    return emit(p, OP_NUM, 0, v);
  }
  if (isalpha((unsigned char)c) || c == '_') {
    size_t start = p->at;
    while (isalnum((unsigned char)p->s[p->at]) || p->s[p->at] == '_')
      p->at++;
    size_t len = p->at - start;
    skip_space(p);
    if (p->s[p->at] == '(')
      return parse_call(p, p->s + start, len);
    for (int i = 0; i < p->n_vars; i++)
      if (strlen(p->vars[i]) == len && strncmp(p->vars[i], p->s + start, len) == 0)
        return emit(p, OP_VAR, i, 0);
    p->at = start;
    return fail(p, "unknown name");
  }
  return fail(p, c == '\0' ? "unexpected end" : "unexpected character");
}

static int parse_power(parser *p) {
  if (parse_primary(p) != 0)
    return -1;
  skip_space(p);
  if (p->s[p->at] == '^') {
    p->at++;
    if (parse_unary(p) != 0)
      return -1;
    return emit(p, OP_POW, 0, 0);
  }
  return 0;
}

static int parse_unary(parser *p) {
  if (++p->depth > MAX_DEPTH)
    return fail(p, "nested too deeply");
  skip_space(p);
  int rc;
  if (p->s[p->at] == '-') {
    p->at++;
    rc = parse_unary(p) != 0 ? -1 : emit(p, OP_NEG, 0, 0);
  } else if (p->s[p->at] == '+') {
    p->at++;
    rc = parse_unary(p);
  } else {
    rc = parse_power(p);
  }
  p->depth--;
  return rc;
}

static int parse_term(parser *p) {
  if (parse_unary(p) != 0)
    return -1;
  for (;;) {
    skip_space(p);
    const char c = p->s[p->at];
    if (c != '*' && c != '/' && c != '%')
      return 0;
    p->at++;
    if (parse_unary(p) != 0 || emit(p, c == '*' ? OP_MUL : c == '/' ? OP_DIV : OP_MOD, 0, 0) != 0)
      return -1;
  }
}

static int parse_expr(parser *p) {
  if (++p->depth > MAX_DEPTH)
    return fail(p, "nested too deeply");
  int rc = parse_term(p);
  while (rc == 0) {
    skip_space(p);
    const char c = p->s[p->at];
    if (c != '+' && c != '-')
      break;
    p->at++;
    rc = parse_term(p) != 0 ? -1 : emit(p, c == '+' ? OP_ADD : OP_SUB, 0, 0);
  }
  p->depth--;
  return rc;
}

int ust__expr_compile(const char *text, const char *const *vars, int n_vars, ust__expr **out) {
  *out = NULL;
  if (text == NULL || strlen(text) > MAX_TEXT)
    return ust__error(UST_EPROBLEM, "expression is missing or longer than %d characters", MAX_TEXT);
  ust__expr *e = calloc(1, sizeof *e);
  if (e == NULL)
    return ust__error(UST_ENOMEM, "out of memory");
  snprintf(e->text, sizeof e->text, "%s", text);
  parser p = {e->text, 0, 0, vars, n_vars, e, 0};
  if (parse_expr(&p) == 0) {
    skip_space(&p);
    if (p.s[p.at] != '\0')
      fail(&p, "unexpected character");
  }
  /* The stack depth a program needs is bounded by its length; check it. */
  int depth = 0, max_depth = 0;
  for (int i = 0; !p.failed && i < e->n; i++) {
    const step *s = &e->steps[i];
    depth += s->op == OP_NUM || s->op == OP_VAR ? 1
             : s->op == OP_MIN || s->op == OP_MAX ? 1 - s->arg
             : s->op == OP_NEG || s->op == OP_CEIL || s->op == OP_FLOOR || s->op == OP_ABS ? 0
             : -1;
    if (depth > max_depth)
      max_depth = depth;
  }
  if (!p.failed && max_depth > MAX_STACK)
    fail(&p, "needs too deep a stack");
  if (p.failed) {
    free(e);
    return UST_EPROBLEM;
  }
  *out = e;
  return 0;
}

static int eval(const ust__expr *e, const double *values, double *out, int quiet) {
  double st[MAX_STACK];
  int sp = 0;
  for (int i = 0; i < e->n; i++) {
    const step *s = &e->steps[i];
    double b;
    switch (s->op) {
    case OP_NUM: st[sp++] = s->v; break;
    case OP_VAR: st[sp++] = values[s->arg]; break;
    case OP_NEG: st[sp - 1] = -st[sp - 1]; break;
    case OP_CEIL: st[sp - 1] = ceil(st[sp - 1]); break;
    case OP_FLOOR: st[sp - 1] = floor(st[sp - 1]); break;
    case OP_ABS: st[sp - 1] = fabs(st[sp - 1]); break;
    case OP_MIN:
    case OP_MAX: {
      double v = st[sp - s->arg];
      for (int k = sp - s->arg + 1; k < sp; k++)
        v = s->op == OP_MIN ? fmin(v, st[k]) : fmax(v, st[k]);
      sp -= s->arg;
      st[sp++] = v;
      break;
    }
    default:
      b = st[--sp];
      if ((s->op == OP_DIV || s->op == OP_MOD || s->op == OP_CDIV) && b == 0)
        return quiet ? UST_EINVAL : ust__error(UST_EINVAL, "expression '%s': division by zero", e->text);
      switch (s->op) {
      case OP_ADD: st[sp - 1] += b; break;
      case OP_SUB: st[sp - 1] -= b; break;
      case OP_MUL: st[sp - 1] *= b; break;
      case OP_DIV: st[sp - 1] /= b; break;
      case OP_MOD: st[sp - 1] = fmod(st[sp - 1], b); break;
      case OP_POW: st[sp - 1] = pow(st[sp - 1], b); break;
      case OP_CDIV: st[sp - 1] = ceil(st[sp - 1] / b); break;
      }
    }
  }
  if (sp != 1 || !isfinite(st[0]))
    return quiet ? UST_EINVAL : ust__error(UST_EINVAL, "expression '%s': the result is not a finite number", e->text);
  *out = st[0];
  return 0;
}

int ust__expr_eval(const ust__expr *e, const double *values, double *out) { return eval(e, values, out, 0); }
int ust__expr_eval_quiet(const ust__expr *e, const double *values, double *out) { return eval(e, values, out, 1); }

void ust__expr_free(ust__expr *e) { free(e); }
