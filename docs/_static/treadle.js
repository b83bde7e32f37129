/* A code block wider than the page's column (the README's commands with
   their comments, the loop example) is wrapped rather than cut at the right
   edge: each of its lines becomes a block whose continuation is indented
   past the line's own indentation, so that a wrapped line is not read as
   the next one. Blocks that fit are left as they are. */
(function () {
  function lines(pre) {
    // Split the highlighted HTML at its newlines, closing the spans open at
    // a newline and opening them again on the next line.
    var html = pre.innerHTML, out = [], line = "", open = [], i = 0;
    while (i < html.length) {
      var c = html[i];
      if (c === "<") {
        var end = html.indexOf(">", i), tag = html.slice(i, end + 1);
        if (tag.startsWith("</")) open.pop(); else if (!tag.endsWith("/>")) open.push(tag);
        line += tag; i = end + 1;
      } else if (c === "\n") {
        out.push(line + "</span>".repeat(open.length)); line = open.join(""); i += 1;
      } else { line += c; i += 1; }
    }
    if (line.replace(/<[^>]*>/g, "") !== "") out.push(line);
    return out;
  }
  function wrap(pre) {
    pre.innerHTML = lines(pre).map(function (line) {
      var text = line.replace(/<[^>]*>/g, "");
      var indent = text.length - text.replace(/^ +/, "").length + 4;
      return '<span class="wrapped-line" style="padding-left:' + indent + 'ch;text-indent:-' + indent + 'ch">' + line + "</span>";
    }).join("");
    pre.classList.add("wrapped");
  }
  window.addEventListener("load", function () {
    document.querySelectorAll("article div.highlight pre").forEach(function (pre) {
      if (pre.scrollWidth > pre.clientWidth + 1) wrap(pre);
    });
  });
})();
