package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

type bar struct {
	label string
	value float64
	text  string
	col   color.RGBA
}

var (
	colDlock = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	colPeer  = color.RGBA{0xff, 0x7f, 0x0e, 0xff}
	colFloor = color.RGBA{0x99, 0x99, 0x99, 0xff}
	colAxis  = color.RGBA{0x33, 0x33, 0x33, 0xff}
)

func colorOf(lr *libResult) color.RGBA {
	switch {
	case !lr.included:
		return colFloor
	case lr.lib.name == "dlock":
		return colDlock
	default:
		return colPeer
	}
}

func writeChart(cfg config, res *results) error {
	const w, h = 1200, 520
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)

	pingMed := 0.0
	if p := res.find("PING floor"); p != nil {
		pingMed = median(p.w1Rates)
	}
	var left, right []bar
	for _, lr := range res.libs {
		if pingMed > 0 && len(lr.w1Rates) > 0 {
			r := median(lr.w1Rates) / pingMed
			left = append(left, bar{lr.lib.name, r, fmt.Sprintf("%.2f", r), colorOf(lr)})
		}
		if lr.included && len(lr.w2Call) > 0 {
			d := pct(lr.w2Call, .5)
			right = append(right, bar{lr.lib.name, float64(d) / float64(time.Microsecond), asciiDur(d), colorOf(lr)})
		}
	}
	if len(res.pingRTT) > 0 {
		d := pct(res.pingRTT, .5)
		right = append(right, bar{"PING RTT", float64(d) / float64(time.Microsecond), asciiDur(d), colFloor})
	}
	text(img, 20, 22, fmt.Sprintf("dlock vs peers on one local redis-server (%d rounds x %v). Blue: dlock, orange: peers, grey: floors.", cfg.rounds, cfg.dur), colAxis)
	panel(img, image.Rect(20, 50, w/2-20, h-20), "W1 uncontended Lock+Unlock pairs/s, ratio to PING floor (higher is better)", left)
	panel(img, image.Rect(w/2+20, 50, w-20, h-20), "W2 handoff p50 from the Unlock call, microseconds (lower is better)", right)

	f, err := os.Create(filepath.Join(cfg.outDir, "benchmarks.png"))
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func text(img draw.Image, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func textWidth(s string) int {
	return font.MeasureString(basicfont.Face7x13, s).Round()
}

func fill(img draw.Image, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

// panel draws a vertical bar chart of bars inside r.
func panel(img draw.Image, r image.Rectangle, title string, bars []bar) {
	text(img, r.Min.X, r.Min.Y+10, title, colAxis)
	plot := image.Rect(r.Min.X+10, r.Min.Y+40, r.Max.X-10, r.Max.Y-40)
	fill(img, image.Rect(plot.Min.X, plot.Max.Y, plot.Max.X, plot.Max.Y+1), colAxis)
	if len(bars) == 0 {
		text(img, plot.Min.X, plot.Min.Y+20, "no data", colAxis)
		return
	}
	top := 0.0
	for _, b := range bars {
		top = max(top, b.value)
	}
	if top <= 0 {
		top = 1
	}
	slot := plot.Dx() / len(bars)
	bw := slot * 6 / 10
	for i, b := range bars {
		x0 := plot.Min.X + i*slot + (slot-bw)/2
		bh := int(float64(plot.Dy()) * b.value / top)
		fill(img, image.Rect(x0, plot.Max.Y-bh, x0+bw, plot.Max.Y), b.col)
		text(img, x0+(bw-textWidth(b.text))/2, plot.Max.Y-bh-4, b.text, colAxis)
		cx := plot.Min.X + i*slot + slot/2
		lines := []string{b.label}
		if textWidth(b.label) > slot-6 {
			if a, z, ok := strings.Cut(b.label, " "); ok {
				lines = []string{a, z}
			}
		}
		for j, l := range lines {
			text(img, cx-textWidth(l)/2, plot.Max.Y+16+14*j, l, colAxis)
		}
	}
}

// asciiDur is fmtDur for basicfont, which has no 'µ'.
func asciiDur(d time.Duration) string { return strings.ReplaceAll(fmtDur(d), "µ", "u") }
